"""Attention over packed documents: longmoe's tiled ``packed_causal_attention`` against the two obvious
ways, in the same run on the same inputs.

Peers:
- ``full mask``: one ``scaled_dot_product_attention`` with the ``[T, T]`` block-diagonal causal mask
  (what the MLA layer did before, and ``packed_causal_attention_reference``);
- ``per document``: one causal ``scaled_dot_product_attention`` call per document (a Python loop;
  longmoe's own path forced with ``min_doc_tokens=1``), which longmoe picks when documents average
  ``MIN_DOC_TOKENS`` or more (its tiles otherwise).

Useful FLOPs count only the allowed (causal, same-document) scores: ``Σ_docs n(n+1)/2 · 2 · (Dq + Dv)``
forward, 2.5× that for the backward (the conventional attention count). Layouts are what training
produces: windows of ``W`` tokens, each holding documents of random lengths, concatenated into one row.

    python -m bench.packed_attention           # T = 4096 and 16384, fp32 and bf16; 3 alternating rounds
    python -m bench.packed_attention --quick   # T = 4096, fp32, one round (seconds)

Each round runs every case, the three implementations back to back; the file keeps each time's median
over rounds and the per-round fwd+bwd speed-up's median and [min, max].
"""

from __future__ import annotations

import argparse
import random

import torch

from bench.common import (
    add_rounds_option,
    markdown_table,
    over_rounds,
    range_cell,
    rounds_arg,
    timeit,
    write_results,
)
from longmoe.ops.attention import packed_causal_attention, packed_causal_attention_reference


def layout(T: int, window: int, lo: int, hi: int, seed: int = 0) -> torch.Tensor:
    """``cu_seqlens`` of ``T // window`` windows, each cut into documents of ``U[lo, hi]`` tokens."""
    rng, cu = random.Random(seed), [0]
    for w in range(T // window):
        end = (w + 1) * window
        while cu[-1] < end:
            cu.append(min(end, cu[-1] + rng.randint(lo, hi)))
    return torch.tensor(cu)


def per_document(q, k, v, cu):
    """One causal attention call per document: the op's own loop path, forced for every layout."""
    return packed_causal_attention(q, k, v, cu, min_doc_tokens=1)


IMPLS = {
    "longmoe": packed_causal_attention,
    "full mask": packed_causal_attention_reference,
    "per document": per_document,
}


def useful_flops(cu: torch.Tensor, D: int, Dv: int, H: int) -> float:
    n = (cu[1:] - cu[:-1]).double()
    return float((n * (n + 1) / 2).sum()) * 2 * (D + Dv) * H


def run_case(T: int, window: int, doc: tuple[int, int], dtype: torch.dtype, H: int, D: int) -> list[dict]:
    cu = layout(T, window, *doc)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3))
    ref = packed_causal_attention_reference(q, k, v, cu).float()
    flops = useful_flops(cu, D, D, H)
    rows = []
    for name, fn in IMPLS.items():
        out = fn(q, k, v, cu)
        err = float((out.float() - ref).abs().max() / ref.abs().max())
        with torch.no_grad():
            t_fwd = timeit(lambda fn=fn: fn(q, k, v, cu), iters=5)
        dout = torch.randn_like(out)
        t_bwd = timeit(lambda fn=fn, d=dout: torch.autograd.grad(fn(q, k, v, cu), (q, k, v), d), iters=3)
        rows.append(
            dict(
                T=T,
                window=window,
                docs=f"{doc[0]}-{doc[1]}",
                n_docs=len(cu) - 1,
                dtype=str(dtype)[6:],
                impl=name,
                fwd_s=t_fwd,
                fwdbwd_s=t_bwd,
                fwd_gflops=flops / t_fwd / 1e9,
                fwdbwd_gflops=3.5 * flops / t_bwd / 1e9,
                max_rel_err=err,
            )
        )
        print(rows[-1], flush=True)
    return rows


SPEEDUP = "fwdbwd_speedup_vs_full_mask"  # full mask's fwd+bwd time / this row's, in the same round


def _case(r: dict) -> tuple:
    return r["T"], r["window"], r["docs"], r["dtype"]


def with_speedups(rows: list[dict]) -> list[dict]:
    """One round's rows with each one's speed-up: the full mask's fwd+bwd time over the row's, same case
    (above 1 = faster than the full mask)."""
    base = {_case(r): r["fwdbwd_s"] for r in rows if r["impl"] == "full mask"}
    return [{**r, SPEEDUP: base[_case(r)] / r["fwdbwd_s"]} for r in rows]


def one_round(cases: list[tuple], H: int, D: int) -> list[dict]:
    """Every case once, the implementations back to back, with each row's speed-up in this round."""
    return with_speedups([r for T, W, doc, dt in cases for r in run_case(T, W, doc, dt, H, D)])


def combine(rounds: list[list[dict]]) -> list[dict]:
    """Per row: each number's median over rounds (same keys as one round's), the per-round speed-up's
    median and [min, max] (``SPEEDUP + "_range"``), and the per-round times."""
    return [
        over_rounds([r[i] for r in rounds], timed=("fwd_s", "fwdbwd_s"), ratios={SPEEDUP: SPEEDUP + "_range"})
        for i in range(len(rounds[0]))
    ]


def render(rows: list[dict], H: int, D: int, n_rounds: int) -> str:
    """The markdown table (speed-ups against the full-mask row of the same case, per round)."""
    table = [
        [
            r["T"],
            r["window"],
            r["docs"],
            r["n_docs"],
            r["dtype"],
            r["impl"],
            r["fwd_s"],
            r["fwdbwd_s"],
            range_cell(r[SPEEDUP + "_range"]),
            r["fwdbwd_gflops"],
            r["max_rel_err"],
        ]
        for r in rows
    ]
    header = [
        "T",
        "window",
        "doc tokens",
        "docs",
        "dtype",
        "impl",
        "fwd s",
        "fwd+bwd s",
        "fwd+bwd speed-up vs full mask, median [min, max]",
        "fwd+bwd useful GFLOP/s",
        "max rel err",
    ]
    md = (
        f"Packed causal attention, H = {H}, head dim {D} (the tiny MLA), one row of T tokens; "
        f"{torch.get_num_threads()} threads; times are medians over {n_rounds} alternating rounds (each runs "
        "every row, the implementations back to back); a speed-up is the per-round ratio's median "
        "[min, max]. "
        "Shared machine: read the ratios.\n\n" + markdown_table(header, table)
    )
    return md


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="T = 4096, fp32 only")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    add_rounds_option(p)
    args = p.parse_args()
    n_rounds = rounds_arg(p, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    H, D = 2, 32  # the tiny preset's MLA heads
    cases = [(4096, 512, (50, 460), torch.float32)]
    if not args.quick:
        cases += [
            (4096, 512, (50, 460), torch.bfloat16),
            (4096, 512, (4, 40), torch.float32),  # many tiny documents: the tiled path
            (16384, 2048, (200, 1800), torch.float32),
            (4096, 4096, (4096, 4096), torch.float32),  # one document: only the causal half is saved
        ]
    rows = combine([one_round(cases, H, D) for _ in range(n_rounds)])
    md = render(rows, H, D, n_rounds)
    write_results(
        "packed_attention_quick" if args.quick else "packed_attention",
        {"n_rounds": n_rounds, "rows": rows},
        md,
        update_readme=not args.quick,
    )


if __name__ == "__main__":
    main()
