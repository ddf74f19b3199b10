"""Model benchmark: LongMoE against ``transformers``' ``KimiLinearForCausalLM`` of matching shapes.

Both models: hidden 256, 8 layers, 3:1 KDA:MLA, 4 heads × 64, MLA q-rank 128 / kv-rank 64, 8 experts
top-2 (expert width 128, one shared expert, first layer dense 512), vocab 2048, random weights, fp32,
CPU. Measured in the same run: training step (forward + backward) tokens/s, no-grad prefill tokens/s,
and decode ms/token after a prefill of 1K and 16K tokens. The GEMM share is ``6 · active params ·
tokens`` per second over this machine's measured ``torch.mm`` throughput (``gemm_roofline``).

    python -m bench.model           # train T in {1K, 4K}, prefill {1K, 4K, 16K}, decode at {1K, 16K};
                                    # 3 alternating rounds: medians and the per-round ratio's [min, max]
    python -m bench.model --quick   # small sizes, one round, seconds
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import torch
from tqdm import tqdm

from bench.common import (
    add_rounds_option,
    gemm_roofline,
    markdown_table,
    over_rounds,
    range_cell,
    rounds_arg,
    spread,
    timeit,
    verdict,
    write_results,
)
from longmoe.cli.inspect import report
from longmoe.config import FFNConfig, ModelConfig
from longmoe.model import LongMoE

VOCAB, D, L, HEADS, HD = 2048, 256, 8, 4, 64


def ours_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=VOCAB,
        d_model=D,
        n_layers=L,
        layer_pattern="LLLM",
        max_seq_len=16384,
        kda_heads=HEADS,
        kda_head_dim=HD,
        kda_gate_rank=HD,
        mla_heads=HEADS,
        mla_q_lora_rank=128,
        mla_kv_lora_rank=64,
        mla_head_dim=HD,
        mla_v_head_dim=HD,
        attn_res_blocks=4,
        ffn=FFNConfig(
            kind="moe",
            dense_hidden=512,
            n_experts=8,
            top_k=2,
            n_shared=1,
            latent_ratio=1,
            expert_hidden=128,
            shared_hidden=128,
            first_k_dense=1,
        ),
    )


def peer_model():
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    logging.getLogger("transformers").setLevel(logging.ERROR)
    c = KimiLinearConfig(
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=L,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        kv_lora_rank=64,
        q_lora_rank=128,
        qk_rope_head_dim=0,
        qk_nope_head_dim=HD,
        v_head_dim=HD,
        num_experts_per_tok=2,
        num_experts=8,
        n_shared_experts=1,
        first_k_dense_replace=1,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=True,
        linear_attn_config={
            "kda_layers": [1, 2, 3, 5, 6, 7],
            "full_attn_layers": [4, 8],
            "head_dim": HD,
            "num_heads": HEADS,
            "short_conv_kernel_size": 4,
        },
    )
    return KimiLinearForCausalLM(c)


def train_tps(step, T: int, iters: int) -> float:
    return T / timeit(step, warmup=1, iters=iters, max_seconds=60)


def decode_ms(step, n: int = 16) -> float:
    """Mean wall ms of ``n`` calls of one decode ``step`` (after one untimed call)."""
    step()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t0) / n * 1e3


def one_round(ours, peer, train_T: list[int], prefill_T: list[int], decode_ctx: list[int]) -> dict:
    """Every measurement once, longmoe then the peer back to back (alternating inside the round)."""
    out: dict = {"train": [], "prefill": [], "decode": []}
    nan = float("nan")
    for T in train_T:
        x = torch.randint(0, VOCAB, (1, T))

        def ours_step(x=x):
            ours.zero_grad(set_to_none=True)
            ours(x, labels=x).loss.backward()

        def peer_step(x=x):
            peer.zero_grad(set_to_none=True)
            peer(input_ids=x, labels=x, use_cache=False).loss.backward()

        ours.train()
        a = train_tps(ours_step, T, 3)
        b = train_tps(peer_step, T, 1) if peer is not None else nan
        out["train"].append({"T": T, "ours_tok_s": a, "peer_tok_s": b})
    ours.eval()
    with torch.no_grad():
        for T in prefill_T:
            x = torch.randint(0, VOCAB, (1, T))
            a = T / timeit(lambda x=x: ours(x), warmup=1, iters=2)
            b = T / timeit(lambda x=x: peer(input_ids=x, use_cache=False), warmup=0, iters=1) if peer else nan
            out["prefill"].append({"T": T, "ours_tok_s": a, "peer_tok_s": b})
        for ctx in decode_ctx:
            x = torch.randint(0, VOCAB, (1, ctx))
            nxt = torch.randint(0, VOCAB, (1, 1))
            cache = ours(x, use_cache=True).cache
            a = decode_ms(lambda nxt=nxt, cache=cache: ours(nxt, cache=cache))
            b = nan
            if peer is not None:
                state = {"pkv": peer(input_ids=x, use_cache=True).past_key_values}

                def peer_step(nxt=nxt, state=state):
                    state["pkv"] = peer(
                        input_ids=nxt, past_key_values=state["pkv"], use_cache=True
                    ).past_key_values

                b = decode_ms(peer_step)
            out["decode"].append({"context": ctx, "ours_ms": a, "peer_ms": b, "cache_bytes": cache.nbytes()})
    return out


def combine(rounds: list[dict]) -> dict:
    """Per row: each side's median over rounds (the keys one round has), and the per-round ratio's median
    and [min, max] (longmoe over the peer for rates, the peer over longmoe for ms: above 1 = longmoe faster);
    the per-round values are kept."""
    out: dict = {}
    for part, (ours_k, peer_k, faster) in {
        "train": ("ours_tok_s", "peer_tok_s", lambda a, b: a / b),
        "prefill": ("ours_tok_s", "peer_tok_s", lambda a, b: a / b),
        "decode": ("ours_ms", "peer_ms", lambda a, b: b / a),
    }.items():
        rows = []
        for i in range(len(rounds[0][part])):
            per = [{**r[part][i], "speedup": faster(r[part][i][ours_k], r[part][i][peer_k])} for r in rounds]
            rows.append(over_rounds(per, timed=(ours_k, peer_k), ratios={"speedup": "speedup"}))
        out[part] = rows
    lo, hi = 0, len(out["decode"]) - 1
    out["decode_growth"] = {
        who: spread([r["decode"][hi][k] / r["decode"][lo][k] for r in rounds])
        for who, k in (("ours", "ours_ms"), ("peer", "peer_ms"))
    }
    return out


def _k(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 else str(n)


def table(res: dict, n_rounds: int, threads: int, roof: float, n_active: int) -> str:
    rows = []
    for r in res["train"]:
        share = 6 * n_active * r["ours_tok_s"] / roof
        cells = [r["ours_tok_s"], r["peer_tok_s"], range_cell(r["speedup"]), f"{share:.1%}"]
        rows.append([f"train fwd+bwd T={r['T']}", "tok/s", *cells])
    for r in res["prefill"]:
        rows.append(
            [f"prefill T={r['T']}", "tok/s", r["ours_tok_s"], r["peer_tok_s"], range_cell(r["speedup"]), ""]
        )
    for r in res["decode"]:
        rows.append(
            [
                f"decode @ctx={r['context']}",
                "ms/token",
                r["ours_ms"],
                r["peer_ms"],
                range_cell(r["speedup"]),
                "",
            ]
        )
    g = res["decode_growth"]
    ctx = [r["context"] for r in res["decode"]]
    rows.append(
        [
            f"decode ms ratio ctx {ctx[-1]} / {ctx[0]}",
            "x",
            range_cell(g["ours"]),
            range_cell(g["peer"]),
            "",
            "",
        ]
    )
    header = ["measurement", "unit", "longmoe", "transformers KimiLinear", "speedup [min, max]", "GEMM share"]
    verdicts = [
        f"training >= 10x transformers (every T): {_worst_verdict(res['train'], 10.0, n_rounds)}",
        f"decode at {_k(ctx[-1])} within 1.3x of {_k(ctx[0])}: "
        + verdict(g["ours"]["min"], g["ours"]["max"], n_rounds, lambda x: x <= 1.3),
    ]
    return (
        markdown_table(header, rows)
        + f"\n\nCPU, fp32, {threads} threads, shared machine; medians over {n_rounds} alternating rounds "
        "(each round runs every row, longmoe then transformers), speed-up = the per-round ratio's median "
        f"[min, max]; roofline {roof / 1e9:.1f} GFLOP/s (torch.mm); active params {n_active:,}.\n\n"
        + "\n".join(f"- {v}" for v in verdicts)
    )


def _worst_verdict(rows: list[dict], target: float, n: int) -> str:
    """One verdict over several rows: met only if every row is met, missed if any row is missed."""
    vs = [verdict(r["speedup"]["min"], r["speedup"]["max"], n, lambda x: x >= target) for r in rows]
    return next(
        (x for worst in ("no verdict", "missed", "not settled") for x in vs if x.startswith(worst)), "met"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run in seconds)")
    ap.add_argument("--no-peer", action="store_true", help="skip the transformers model (no ratios)")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README benchmark table")
    add_rounds_option(ap)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    train_T = [256] if args.quick else [1024, 4096]
    prefill_T = [512] if args.quick else [1024, 4096, 16384]
    decode_ctx = [256, 2048] if args.quick else [1024, 16384]
    n_rounds = rounds_arg(ap, args)
    cfg = ours_config()
    ours = LongMoE(cfg)
    peer = None if args.no_peer else peer_model()
    n_active = report(cfg)["active_params"]
    roof = gemm_roofline()
    rounds = []
    for i in tqdm(range(n_rounds), desc="bench.model rounds"):
        rounds.append(one_round(ours, peer, train_T, prefill_T, decode_ctx))
        print(f"round {i}:", json.dumps(rounds[-1]), flush=True)
    res = combine(rounds)
    name = "model_quick" if args.quick else "model"
    write_results(
        name,
        {"roofline_flops": roof, "active_params": n_active, "n_rounds": n_rounds, **res},
        table(res, n_rounds, torch.get_num_threads(), roof, n_active),
        update_readme=not (args.no_readme or args.quick),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
