"""Model benchmark: LongMoE against ``transformers``' ``KimiLinearForCausalLM`` of matching shapes.

Both models: hidden 256, 8 layers, 3:1 KDA:MLA, 4 heads × 64, MLA q-rank 128 / kv-rank 64, 8 experts
top-2 (expert width 128, one shared expert, first layer dense 512), vocab 2048, random weights, fp32,
CPU. Measured in the same run: training step (forward + backward) tokens/s, no-grad prefill tokens/s,
and decode ms/token after a prefill of 1K and 16K tokens. The GEMM share is ``6 · active params ·
tokens`` per second over this machine's measured ``torch.mm`` throughput (``gemm_roofline``).

    python -m bench.model           # train T in {1K, 4K}, prefill {1K, 4K, 16K}, decode at {1K, 16K}
    python -m bench.model --quick   # small sizes, seconds
"""

from __future__ import annotations

import argparse
import logging
import time
import warnings

import torch

from bench.common import gemm_roofline, markdown_table, timeit, write_results
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run in seconds)")
    ap.add_argument("--no-peer", action="store_true", help="skip the transformers model (no ratios)")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README benchmark table")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    train_T = [256] if args.quick else [1024, 4096]
    prefill_T = [512] if args.quick else [1024, 4096, 16384]
    decode_ctx = [256, 2048] if args.quick else [1024, 16384]
    cfg = ours_config()
    ours = LongMoE(cfg)
    peer = None if args.no_peer else peer_model()
    n_active = report(cfg)["active_params"]
    roof = gemm_roofline()
    rows, results = [], {"train": [], "prefill": [], "decode": []}

    def ours_train(x):
        def f():
            ours.zero_grad(set_to_none=True)
            ours(x, labels=x).loss.backward()

        return f

    def peer_train(x):
        def f():
            peer.zero_grad(set_to_none=True)
            peer(input_ids=x, labels=x, use_cache=False).loss.backward()

        return f

    for T in train_T:
        x = torch.randint(0, VOCAB, (1, T))
        ours.train()
        a = train_tps(ours_train(x), T, 3)
        b = train_tps(peer_train(x), T, 1) if peer is not None else float("nan")
        share = 6 * n_active * a / roof
        results["train"].append({"T": T, "ours_tok_s": a, "peer_tok_s": b, "gemm_share": share})
        rows.append([f"train fwd+bwd T={T}", "tok/s", a, b, a / b, f"{share:.1%}"])
        print(rows[-1], flush=True)
    ours.eval()
    for T in prefill_T:
        x = torch.randint(0, VOCAB, (1, T))
        with torch.no_grad():
            a = T / timeit(lambda x=x: ours(x), warmup=1, iters=2)
            b = (
                T / timeit(lambda x=x: peer(input_ids=x, use_cache=False), warmup=0, iters=1)
                if peer
                else float("nan")
            )
        results["prefill"].append({"T": T, "ours_tok_s": a, "peer_tok_s": b})
        rows.append([f"prefill T={T}", "tok/s", a, b, a / b, ""])
        print(rows[-1], flush=True)
    n_dec = 16
    for ctx in decode_ctx:
        x = torch.randint(0, VOCAB, (1, ctx))
        nxt = torch.randint(0, VOCAB, (1, 1))
        with torch.no_grad():
            cache = ours(x, use_cache=True).cache
            ours(nxt, cache=cache)
            t0 = time.perf_counter()
            for _ in range(n_dec):
                ours(nxt, cache=cache)
            a = (time.perf_counter() - t0) / n_dec * 1e3
            b = float("nan")
            if peer is not None:
                pkv = peer(input_ids=x, use_cache=True).past_key_values
                peer(input_ids=nxt, past_key_values=pkv, use_cache=True)
                t0 = time.perf_counter()
                for _ in range(n_dec):
                    pkv = peer(input_ids=nxt, past_key_values=pkv, use_cache=True).past_key_values
                b = (time.perf_counter() - t0) / n_dec * 1e3
        results["decode"].append({"context": ctx, "ours_ms": a, "peer_ms": b, "cache_bytes": cache.nbytes()})
        rows.append([f"decode @ctx={ctx}", "ms/token", a, b, b / a, ""])
        print(rows[-1], flush=True)
    d0, d1 = results["decode"][0]["ours_ms"], results["decode"][-1]["ours_ms"]
    rows.append(
        [
            f"decode ms ratio ctx {decode_ctx[-1]} / {decode_ctx[0]}",
            "x",
            d1 / d0,
            results["decode"][-1]["peer_ms"] / results["decode"][0]["peer_ms"],
            "",
            "",
        ]
    )
    header = ["measurement", "unit", "longmoe", "transformers KimiLinear", "speedup", "GEMM share"]
    table = markdown_table(header, rows)
    table += (
        f"\n\nCPU, fp32, {torch.get_num_threads()} threads, shared machine; roofline "
        f"{roof / 1e9:.1f} GFLOP/s (torch.mm); active params {n_active:,}."
    )
    name = "model_quick" if args.quick else "model"
    write_results(
        name,
        {"roofline_flops": roof, "active_params": n_active, **results},
        table,
        update_readme=not (args.no_readme or args.quick),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
