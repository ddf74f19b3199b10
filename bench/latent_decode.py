"""One MLA layer's decode attention against its latent rows: the flash pieces a decode step runs, GEMM
formulations of the same, and a plain read of the rows.

A decode step's absorbed MLA attention is one query row per head against ``S`` shared cache rows: two
skinny products (scores ``q rowsᵀ``, then ``softmax · rows``). ``ops/attention/latent.py`` runs it as
PyTorch's fused CPU flash kernel over the rows cut into pieces (merged by log-sum-exps). This benchmark
times that beside the formulations a CPU could use instead, on the tiny preset's shapes (2 heads, 1
query, 32-wide fp32 rows), 1 thread, CPU time, rounds alternating the arms:

- ``flash pieces`` (the step) and ``flash, one piece``;
- ``two GEMMs``: ``qs @ rowsᵀ``, one softmax, ``p @ rows`` (MKL);
- ``two GEMMs, 4,096-row pieces``: both GEMMs batched over the pieces, merged by maxima and sums in fp32;
- ``two GEMMs, 4 MB blocks``: a host loop over 32,768-row blocks (each block's second GEMM reads it
  from cache), merged the same way;
- ``read once``: ``rows.sum()``, the read every formulation must make at least once.

GB/s is the rows' bytes over the time (one read's worth, whatever an arm reads); the error is the
largest absolute difference from a float64 evaluation of the same formula (logits of a few units).

    python -m bench.latent_decode --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench.common import counted_spread, markdown_table, write_results
from bench.long_context_base import K, load
from longmoe.ops.attention import latent

LENGTHS = [4 * K, 64 * K, 256 * K, 1024 * K]
Arm = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]  # (q [1, H, 1, C], rows [1, S, C], P)


def _two_gemms(q: torch.Tensor, rows: torch.Tensor, prefix: int) -> torch.Tensor:
    B, H, T, C = q.shape
    s = (q.reshape(H * T, C) * C**-0.5) @ rows[0].T  # [Q, S]
    return (torch.softmax(s, dim=-1) @ rows[0]).view(B, H, T, C)


def _merge(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``(Σ_j e^{s_j - m} rows_j [Q, C], Σ_j e^{s_j - m} [Q, 1], m [Q, 1])`` per part -> ``[Q, C]``."""
    num, den, m = (torch.stack(x) for x in zip(*parts, strict=True))
    w = (m - m.amax(0)).exp_()
    return (w * num).sum(0) / (w * den).sum(0)


def _part(qs: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = qs @ r.T  # [Q, rows]
    m = s.amax(-1, keepdim=True)
    e = s.sub_(m).exp_()
    return e @ r, e.sum(-1, keepdim=True), m


def _gemm_pieces(q: torch.Tensor, rows: torch.Tensor, prefix: int, piece: int = 4096) -> torch.Tensor:
    B, H, T, C = q.shape
    qs = q.reshape(H * T, C) * C**-0.5
    n = (rows.shape[1] - 1) // piece  # whole pieces; the rest (1..piece rows) is one more part
    full = rows[0, : n * piece].view(n, piece, C)
    s = torch.matmul(qs, full.transpose(1, 2))  # [n, Q, piece]
    m = s.amax(-1, keepdim=True)
    e = s.sub_(m).exp_()
    parts = list(zip(torch.matmul(e, full), e.sum(-1, keepdim=True), m, strict=True))
    parts.append(_part(qs, rows[0, n * piece :]))
    return _merge(parts).view(B, H, T, C)


def _gemm_blocks(q: torch.Tensor, rows: torch.Tensor, prefix: int, block: int = 32 * K) -> torch.Tensor:
    B, H, T, C = q.shape
    qs = q.reshape(H * T, C) * C**-0.5
    parts = [_part(qs, rows[0, a : a + block]) for a in range(0, rows.shape[1], block)]
    return _merge(parts).view(B, H, T, C)


def _flash(splits: int | None) -> Arm:
    return lambda q, rows, prefix: latent.latent_attention(q, rows, prefix, splits=splits)


ARMS: dict[str, Arm] = {
    "flash pieces (the step)": _flash(None),
    "flash, one piece": _flash(1),
    "two GEMMs": _two_gemms,
    "two GEMMs, 4,096-row pieces": _gemm_pieces,
    "two GEMMs, 4 MB blocks": _gemm_blocks,
    "read once (rows.sum)": lambda q, rows, prefix: rows.sum(),
}


def _exact(q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The one-query attention in float64 (no mask: one new token sees every row)."""
    B, H, T, C = q.shape
    qd, rd = q.double().reshape(H * T, C), rows[0].double()
    return (torch.softmax(qd @ rd.T * C**-0.5, dim=-1) @ rd).view(B, H, T, C)


@torch.no_grad()
def run(lengths: list[int], rounds: int) -> dict:
    rows_out = {}
    for n in lengths:
        gen = torch.Generator().manual_seed(n)
        rows = torch.randn(1, n + 1, 32, generator=gen)
        q = torch.randn(1, 2, 1, 32, generator=gen) * 3.0  # logits of a few units
        exact = _exact(q, rows)
        iters = max(3, min(50, (4 << 20) // n))
        cpu: dict[str, list[float]] = {a: [] for a in ARMS}
        err = {}
        for r in range(rounds):
            for arm, fn in ARMS.items():
                out = fn(q, rows, n)
                if r == 0 and out.dim() == 4:
                    err[arm] = (out.double() - exact).abs().max().item()
                c0 = time.process_time()
                for _ in range(iters):
                    fn(q, rows, n)
                cpu[arm].append((time.process_time() - c0) / iters * 1e3)
            print("latent_decode", r, n, {a: round(v[-1], 3) for a, v in cpu.items()}, flush=True)
        nbytes = rows.numel() * rows.element_size()
        rows_out[n] = {
            "bytes": nbytes,
            "cpu_ms": {a: counted_spread(v) for a, v in cpu.items()},
            "gb_per_s": {a: nbytes / statistics.median(v) / 1e6 for a, v in cpu.items()},
            "max_abs_error": err,
        }
        del rows
    return {"rows": rows_out, "threads": torch.get_num_threads(), "load_avg": load(), "dtype": "float32",
            "shape": "2 heads, 1 query, 32-wide rows (the tiny preset's MLA)"}  # fmt: skip


def table(res: dict) -> str:
    lengths = list(res["rows"])
    header = ["arm"] + [f"{int(n) // K}K: CPU ms [min, max], GB/s, error" for n in lengths]
    body = []
    for arm in ARMS:
        cells = []
        for n in lengths:
            r = res["rows"][n]
            c, e = r["cpu_ms"][arm], r["max_abs_error"].get(arm)
            cells.append(
                f"{c['median']:.3f} [{c['min']:.3f}, {c['max']:.3f}], {r['gb_per_s'][arm]:.1f}"
                + ("" if e is None else f", {e:.1e}")
            )
        body.append([arm] + cells)
    return markdown_table(header, body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default=None, help="comma-separated cached rows (4K,64K,256K,1M)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 4K rows, 1 round")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lengths = [int(v) for v in args.lengths.split(",")] if args.lengths else LENGTHS
    if args.quick:
        lengths, args.rounds = [4 * K], 1
    t0 = time.process_time()
    res = run(lengths, args.rounds)
    res["cpu_seconds"] = time.process_time() - t0
    md = (
        f"One MLA layer's decode attention (tiny preset shapes: 2 heads, 1 query, 32-wide fp32 rows), "
        f"{res['threads']} thread under contention, {args.rounds} alternating rounds; GB/s = the rows' "
        "bytes over the time; error = max |difference| from float64:\n\n" + table(res)
    )
    write_results("latent_decode", res, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
