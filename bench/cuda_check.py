"""CUDA checks for a lent GPU: KDA chunk parity at length and the engine's ``--compile`` decode.

Not part of ``make bench`` (no GPU on the CI machines); run it where a GPU exists::

    python -m bench.cuda_check          # ~2 minutes on one H200; writes bench/results/cuda_check.*

1. ``kda_chunk`` against the float64 token-by-token recurrence at T = 4096 on CUDA, fp32 and bf16,
   for the bounded gate (all-GEMM ``factorised`` path) and the unbounded ``-softplus`` gate
   (exact ``logspace`` path): max |error| and finiteness.
2. The engine at batch 1 on CUDA, eager vs ``--compile`` (decode captured in CUDA graphs; prefill
   stays eager there, see longmoe/serve/compiled.py): identical greedy tokens, decode ms/token
   (median gap between streamed tokens) and the first request's time (it compiles).
"""

from __future__ import annotations

import time
import warnings

import torch

from bench.common import bench_tokenizer, markdown_table, write_results
from longmoe.model import LongMoE
from longmoe.ops.gates import bounded_decay, softplus_decay
from longmoe.ops.kda.chunk import kda_chunk
from longmoe.ops.kda.naive import kda_recurrent
from longmoe.presets import preset
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplingParams

DEV = "cuda"


def kda_parity(T: int = 4096) -> dict[str, dict]:
    torch.manual_seed(0)
    B, H, K = 2, 4, 64
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, K, device=DEV), dim=-1) for _ in range(2))
    v, h = torch.randn(B, T, H, K, device=DEV), 3 * torch.randn(B, T, H, K, device=DEV)
    A, beta = torch.randn(H, K, device=DEV), torch.rand(B, T, H, device=DEV)
    res = {}
    for name, g, intra in (
        ("bounded/factorised", bounded_decay(h, A), "factorised"),
        ("softplus/logspace", softplus_decay(h, A), "logspace"),
    ):
        ref, _ = kda_recurrent(*(t.double() for t in (q, k, v, g, beta)))  # [B, T, H, K]
        for dt in (torch.float32, torch.bfloat16):
            o, _ = kda_chunk(*(t.to(dt) for t in (q, k, v, g, beta)), intra=intra)
            err = (o.double() - ref).abs().max().item()
            res[f"{name} {str(dt).split('.')[-1]}"] = {"max_abs_err": err, "finite": bool(o.isfinite().all())}
    return res


def compiled_decode(ctx: int = 1024, n: int = 96) -> dict:
    cfg = preset("tiny").replace(max_seq_len=1 << 14)
    tok = bench_tokenizer(512)
    prompt = torch.randint(20, cfg.vocab_size, (ctx,), generator=torch.Generator().manual_seed(1)).tolist()
    params = SamplingParams(max_tokens=n + 1, temperature=0.0, ignore_eos=True)

    def engine(**kw) -> Engine:
        torch.manual_seed(0)
        opts = {"cache_budget_bytes": 8 << 30, "prefill_chunk": 2048, "prefix_cache": False, **kw}
        return Engine(LongMoE(cfg).to(DEV), tok, EngineConfig(**opts))

    def decode_ms(e: Engine) -> float:
        stamps = [time.perf_counter() for _ in e.submit(prompt, params).events()]
        gaps = sorted(b - a for a, b in zip(stamps[1:-1], stamps[2:]))
        return 1000 * gaps[len(gaps) // 2]

    with engine() as eager:
        decode_ms(eager)  # warm-up
        ref = eager.generate(prompt, params).token_ids
        eager_ms = decode_ms(eager)
    t0 = time.perf_counter()
    with engine(compile=True, compile_warmup=False) as comp:
        got = comp.generate(prompt, params).token_ids
        first_s = time.perf_counter() - t0
        comp_ms = min(decode_ms(comp), decode_ms(comp))
    return {
        "identical_tokens": ref == got,
        "tokens": len(ref),
        "eager_ms": eager_ms,
        "compiled_ms": comp_ms,
        "speedup": eager_ms / comp_ms,
        "first_request_s": first_s,
    }


def main() -> int:
    if not torch.cuda.is_available():
        raise SystemExit("bench.cuda_check needs a CUDA GPU")
    warnings.filterwarnings("ignore")
    parity, dec = kda_parity(), compiled_decode()
    rows = [
        [f"kda_chunk {k}: max abs err vs fp64 (T=4096)", v["max_abs_err"], v["finite"]]
        for k, v in parity.items()
    ]
    rows += [
        ["engine decode ms/token batch 1, eager", dec["eager_ms"], ""],
        [
            "engine decode ms/token batch 1, --compile (CUDA graphs)",
            dec["compiled_ms"],
            dec["identical_tokens"],
        ],
        ["compiled decode speed-up", dec["speedup"], ""],
        ["first request s (compiles)", dec["first_request_s"], ""],
    ]
    table = markdown_table(["measurement", "value", "finite / identical tokens"], rows)
    table += f"\n\n{torch.cuda.get_device_name(0)}, torch {torch.__version__}; tiny preset, random weights."
    write_results("cuda_check", {"kda_parity": parity, "engine": dec}, table, update_readme=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
