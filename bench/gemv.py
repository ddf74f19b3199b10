"""One-row weight products (the batch-1 decode step's linears) against the memory's read speed.

A decode step of the CPU serving benchmark (``bench/cpu_serve.py``) is mostly ``[1, K] @ W^T`` products
whose time is the weight read. This benchmark isolates them: ``--weights`` cold ``[N, K]`` matrices (more
bytes than the caches hold), each multiplied once per pass by a fresh one-row activation, through each
kernel a longmoe step can use, as GB/s of weight read beside this machine's read bandwidth (a plain sum
over 1 GiB, ``bench/cpu_floor.read_bandwidth``), at each thread count:

- fp32: PyTorch's ``mm`` (BLAS) and the inductor reduction ``(x * W).sum(-1)`` that the compiled step
  uses (``serve/gemv_pass.py``);
- int8 weights, float activations: ``_weight_int8pack_mm`` (bf16 activations, its vectorised path) and
  the compiled step's inductor reduction ``(x * q).sum(-1) * s``;
- int8 weights × int8 activations: the activation row quantized per row (symmetric, ``max|x| / 127``),
  ``torch._int_mm`` on the ``[K, N]`` view of ``q`` (oneDNN's integer dot products), scaled back. This is
  the form llama.cpp's q8_0 decode takes (it quantizes activations per 32-block); longmoe's int8 mode does
  not use it today. Its error from the activation rounding is reported beside its speed.

Each kernel's output is checked against the fp32 product (on the dequantized weight for the int8 arms):
max relative error.

    python -m bench.gemv                 # 64 weights 3072×1024, threads 1 and 2
    python -m bench.gemv --quick         # 8 weights 512×256 (cache-resident: a smoke test)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench.common import markdown_table, write_results
from bench.cpu_floor import read_bandwidth
from longmoe.ops.quant import dequantize_int8, quantize_int8

Kernel = Callable[[torch.Tensor, int], torch.Tensor]  # (x [1, K] fp32, weight index) -> [1, N] fp32


def kernels(w: list[torch.Tensor], q: list[torch.Tensor], s: list[torch.Tensor]) -> dict[str, Kernel]:
    """Every arm over the same weights (fp32 ``w``, int8 ``q`` with per-row scales ``s``)."""
    red_fp32 = torch.compile(lambda x, wi: (x * wi).sum(-1)[None], dynamic=False)
    red_int8 = torch.compile(lambda x, qi, si: (x * qi).sum(-1)[None] * si, dynamic=False)
    s_bf16 = [si.to(torch.bfloat16) for si in s]
    qt = [qi.t() for qi in q]  # [K, N] views: B column-major, the integer kernel's dot along K
    return {
        "fp32 mm (BLAS)": lambda x, i: x @ w[i].t(),
        "fp32 reduction (inductor)": lambda x, i: red_fp32(x[0], w[i]),
        "int8 _weight_int8pack_mm (bf16 act)": lambda x, i: torch.ops.aten._weight_int8pack_mm(
            x.to(torch.bfloat16), q[i], s_bf16[i]
        ).float(),
        "int8 reduction (inductor)": lambda x, i: red_int8(x[0], q[i], s[i]),
        "int8 x int8 _int_mm (act per row)": lambda x, i: _int8_int8(x, qt[i], s[i]),
    }


def _int8_int8(x: torch.Tensor, qt: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    xq, sx = quantize_int8(x)  # the activation row, symmetric per row as the weights are: [1, K], [1]
    return torch._int_mm(xq, qt).float() * (sx[:, None] * s)  # [1, N]


def one_pass(fn: Kernel, xs: list[torch.Tensor]) -> float:
    """Seconds for one product with each weight (each with its own activation row)."""
    t0 = time.perf_counter()
    for i, x in enumerate(xs):
        fn(x, i)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 weights 512x256 (cache-resident smoke test)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--weights", type=int, default=None, help="number of weights (default 64; quick 8)")
    ap.add_argument("--shape", default=None, help="N,K of each weight (default 3072,1024; quick 512,256)")
    ap.add_argument("--passes", type=int, default=7, help="timed passes per arm and thread count")
    args = ap.parse_args(argv)
    n_w = args.weights or (8 if args.quick else 64)
    N, K = (int(v) for v in (args.shape or ("512,256" if args.quick else "3072,1024")).split(","))
    threads = [int(t) for t in args.threads.split(",")]
    g = torch.Generator().manual_seed(0)
    w = [torch.randn(N, K, generator=g) / K**0.5 for _ in range(n_w)]
    q, s = zip(*(quantize_int8(wi) for wi in w), strict=True)
    q, s = list(q), [si.float() for si in s]
    xs = [torch.randn(1, K, generator=g) for _ in range(n_w)]
    ref_fp32 = [x @ wi.t() for x, wi in zip(xs, w, strict=True)]  # [1, N] each
    ref_int8 = [x @ dequantize_int8(qi, si).t() for x, qi, si in zip(xs, q, s, strict=True)]
    arms = kernels(w, q, s)
    bytes_of = {a: n_w * N * K * (4 if a.startswith("fp32") else 1) for a in arms}
    rows, runs = [], {}
    for t in threads:
        torch.set_num_threads(t)
        bw = read_bandwidth()
        res = {}
        for name, fn in arms.items():
            ref = ref_fp32 if name.startswith("fp32") else ref_int8
            with torch.inference_mode():
                err = max(
                    ((fn(x, i) - r).abs().max() / r.abs().max()).item()
                    for i, (x, r) in enumerate(zip(xs, ref, strict=True))
                )  # also the warm-up (compiles)
                times = [one_pass(fn, xs) for _ in range(args.passes)]
            gbs = [bytes_of[name] / x / 1e9 for x in times]
            med, us = statistics.median(gbs), statistics.median(times) / n_w * 1e6
            res[name] = {"gb_s": gbs, "max_rel_err": err, "us_per_weight": us}
            share = med / (bw / 1e9)
            spread = f"[{min(gbs):.1f}, {max(gbs):.1f}]"
            rows.append([t, name, f"{med:.1f}", spread, f"{share:.2f}", f"{us:.0f}", f"{err:.1e}"])
            print(rows[-1], flush=True)
        runs[str(t)] = {"read_bandwidth_gb_s": bw / 1e9, "arms": res}
    head = ["threads", "kernel", "GB/s of weight read", "spread", "share of read bandwidth", "µs / weight",
            "max rel. error"]  # fmt: skip
    md = markdown_table(head, rows)
    md += "\n\n" + "; ".join(f"{t} thread(s): read bandwidth {r['read_bandwidth_gb_s']:.1f} GB/s" for t, r in
                             runs.items())  # fmt: skip
    md += (f". {n_w} weights {N}×{K}, {args.passes} passes (median, [min, max]); error against the fp32 "
           "product (on the dequantized weight for int8).")  # fmt: skip
    payload = {"weights": n_w, "shape": [N, K], "passes": args.passes, "runs": runs, "quick": args.quick}
    write_results("gemv_quick" if args.quick else "gemv", payload, md, update_readme=not args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
