"""Decode cost by context for ``bench/serve.py``: ms/token after a prompt of each context length, for the
hybrid and pure-MLA engines' models (model + cache step after a chunked prefill) and ``transformers``'
KimiLinear (gaps between tokens inside its own ``generate``), in alternating rounds.

Each round measures every context on the three arms back to back (hybrid, pure MLA, peer), so a burst
of other work on this shared machine hits the arms alike; the cost growth from the first context to the
last is a per-round ratio, reported as its median and [min, max] over rounds.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from bench.common import spread
from longmoe.config import ModelConfig
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams

WINDOWS = 3  # decode windows per measurement (see robust_ms)
ARMS = {"hybrid": "hybrid_ms", "pure_mla": "pure_mla_ms", "peer": "peer_ms"}


def rand_ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(20, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def robust_ms(stamps: list[float], n: int) -> float:
    """ms/token: the smallest of the median gaps over ``WINDOWS`` windows of ``n`` tokens (the
    machine is shared, so a burst of someone else's work inflates one window, rarely all)."""
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return min(statistics.median(gaps[i * n : (i + 1) * n]) for i in range(WINDOWS)) * 1e3


def engine_decode(engine: Engine, ctx: int, n: int) -> tuple[float, float]:
    """(decode ms/token, prefill s) for a prompt of ``ctx`` tokens: gaps between streamed tokens."""
    params = SamplingParams(max_tokens=WINDOWS * n + 1, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    h = engine.submit(rand_ids(ctx, engine.vocab_size, ctx), params)
    stamps = [time.perf_counter() for _ in h.events()]
    return robust_ms(stamps, n), stamps[0] - t0


def peer_model(cfg: ModelConfig, max_ctx: int):
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    logging.getLogger("transformers").setLevel(logging.ERROR)
    kinds = cfg.layer_types
    c = KimiLinearConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.ffn.dense_hidden,
        moe_intermediate_size=cfg.ffn.expert_hidden,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.mla_heads,
        num_key_value_heads=cfg.mla_heads,
        kv_lora_rank=cfg.mla_kv_lora_rank,
        q_lora_rank=cfg.mla_q_lora_rank,
        qk_rope_head_dim=cfg.mla_shared_key_dim,
        qk_nope_head_dim=cfg.mla_head_dim,
        v_head_dim=cfg.mla_v_head_dim,
        num_experts_per_tok=cfg.ffn.top_k,
        num_experts=cfg.ffn.n_experts,
        n_shared_experts=cfg.ffn.n_shared,
        first_k_dense_replace=cfg.ffn.first_k_dense,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=cfg.tie_embeddings,
        max_position_embeddings=max_ctx,
        linear_attn_config={
            "kda_layers": [i + 1 for i, k in enumerate(kinds) if k == "L"],
            "full_attn_layers": [i + 1 for i, k in enumerate(kinds) if k == "M"],
            "head_dim": cfg.kda_head_dim,
            "num_heads": cfg.kda_heads,
            "short_conv_kernel_size": cfg.kda_conv_size,
        },
    )
    c._attn_implementation = "sdpa"
    return KimiLinearForCausalLM(c).eval()


def peer_decode(peer, ctx: int, n: int, vocab: int) -> tuple[float, float]:
    """(ms/token, prefill s) of ``transformers`` ``generate`` (greedy), stamping each generated token."""
    from transformers import LogitsProcessor, LogitsProcessorList

    stamps: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            stamps.append(time.perf_counter())
            return scores

    x = torch.tensor([rand_ids(ctx, vocab, ctx)])
    t0 = time.perf_counter()
    with torch.no_grad():
        peer.generate(
            x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=WINDOWS * n + 1,
            min_new_tokens=WINDOWS * n + 1,
            do_sample=False,
            logits_processor=LogitsProcessorList([Stamp()]),
        )
    return robust_ms(stamps, n), stamps[0] - t0


def prefilled_caches(engine: Engine, ctxs: list[int]) -> dict:
    """The engine's model cache after a chunked prefill of each context's prompt (kept for every round)."""
    model, step = engine.model, engine.cfg.prefill_chunk
    caches = {}
    for ctx in ctxs:
        ids = torch.tensor([rand_ids(ctx, engine.vocab_size, ctx)])
        c = model.new_cache(1)
        for i in range(0, ctx, step):
            model(ids[:, i : i + step], cache=c)
        caches[ctx] = c
    return caches


def model_step_ms(model, cache, n: int) -> float:
    """ms of one decode step on a clone of ``cache``: the smallest of ``WINDOWS`` medians of ``n`` steps."""
    x, best = torch.tensor([[7]]), float("inf")
    for _ in range(WINDOWS):
        c = cache.clone()
        model(x, cache=c)  # untimed: grows the latent buffer once
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            model(x, cache=c)
            ts.append(time.perf_counter() - t0)
        best = min(best, statistics.median(ts) * 1e3)
    return best


def decode_rounds(hybrid: Engine, mla: Engine, peer, ctxs: list[int], n: int, rounds: int) -> dict:
    """``rounds`` rounds of every context on the three arms back to back. Returns ``decode`` (a row per
    context: each arm's median ms over rounds and the per-round values), ``decode_ratio_last_first``
    (per arm, the median over rounds of last-context / first-context ms) and ``decode_ratio_range`` (that
    ratio's median, [min, max] and per-round values)."""
    caches = {"hybrid": prefilled_caches(hybrid, ctxs), "pure_mla": prefilled_caches(mla, ctxs)}
    nan = float("nan")
    per_round: list[dict[int, dict]] = []
    for r in range(rounds):
        got: dict[int, dict] = {}
        for ctx in ctxs:
            row = {
                "hybrid_ms": model_step_ms(hybrid.model, caches["hybrid"][ctx], n),
                "pure_mla_ms": model_step_ms(mla.model, caches["pure_mla"][ctx], n),
            }
            pm, ps = peer_decode(peer, ctx, n, hybrid.vocab_size) if peer is not None else (nan, nan)
            got[ctx] = {**row, "peer_ms": pm, "peer_prefill_s": ps}
            print(f"decode round {r} ctx {ctx}:", got[ctx], flush=True)
        per_round.append(got)
    return combine_decode(per_round, ctxs)


def combine_decode(per_round: list[dict[int, dict]], ctxs: list[int]) -> dict:
    """``decode_rounds``' result from each round's ``{context: {arm ms..., peer_prefill_s}}``: each value's
    median over rounds, and per arm the per-round last-context / first-context ms ratio (above 1: decode
    grows with context), its median under ``decode_ratio_last_first`` and [min, max] under
    ``decode_ratio_range``."""
    keys = ("hybrid_ms", "pure_mla_ms", "peer_ms", "peer_prefill_s")
    rows = [
        {
            "context": ctx,
            **{k: statistics.median(p[ctx][k] for p in per_round) for k in keys},
            "rounds": [p[ctx] for p in per_round],
        }
        for ctx in ctxs
    ]
    lo, hi = ctxs[0], ctxs[-1]
    rng = {arm: spread([p[hi][k] / p[lo][k] for p in per_round]) for arm, k in ARMS.items()}
    return {
        "decode": rows,
        "decode_ratio_last_first": {arm: s["median"] for arm, s in rng.items()},
        "decode_ratio_range": rng,
    }
