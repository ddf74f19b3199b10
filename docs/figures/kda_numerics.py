"""Figure for docs/kda.md: the factorised chunk form with bounded vs unbounded (−softplus) decay gates.

For increasing decay strength (the gate pre-activation shift), run ``kda_chunk`` in fp32 and bf16 and
report the relative error against the float64 token-by-token reference (inf when the output is not
finite). Run: ``.venv/bin/python docs/figures/kda_numerics.py`` → ``docs/figures/kda_numerics.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from longmoe.ops.gates import bounded_decay, softplus_decay
from longmoe.ops.kda import kda_chunk, kda_recurrent

ROOT = Path(__file__).resolve().parents[2]


def rel_err(shift: float, gate: str, dtype: torch.dtype, T: int = 256) -> float:
    gen = torch.Generator().manual_seed(0)
    B, H, K, V = 1, 2, 16, 16
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    h = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) + shift
    A = torch.zeros(H, K, dtype=torch.float64)
    g = bounded_decay(h, A) if gate == "bounded" else softplus_decay(h, A)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    ref, _ = kda_recurrent(q, k, v, g, beta)
    out, _ = kda_chunk(*(x.to(dtype) for x in (q, k, v, g, beta)))
    out = out.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return ((out - ref).norm() / ref.norm()).item()


def main() -> None:
    shifts = [-4, -2, 0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20]
    data = {}
    for gate in ("bounded", "softplus"):
        for dtype in (torch.float32, torch.bfloat16):
            data[f"{gate} {str(dtype).split('.')[-1]}"] = [rel_err(s, gate, dtype) for s in shifts]
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, errs in data.items():
        ys = [e if e != float("inf") else 1e3 for e in errs]
        ax.plot(
            shifts,
            ys,
            marker="o" if "bounded" in name else "x",
            label=name,
            linestyle="-" if "float32" in name else "--",
        )
    ax.axhline(1e3, color="grey", lw=0.5)
    ax.text(shifts[0], 1.3e3, "inf / NaN", fontsize=8, color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("gate pre-activation shift (stronger decay →)")
    ax.set_ylabel("relative error vs float64 recurrence")
    ax.set_title("kda_chunk (C=16): bounded g = −5·σ(h) vs unbounded g = −softplus(h)")
    ax.legend()
    fig.tight_layout()
    out = ROOT / "docs" / "figures" / "kda_numerics.png"
    fig.savefig(out, dpi=120)
    (out.with_suffix(".json")).write_text(json.dumps({"shifts": shifts, "rel_err": data}, indent=1))
    print(json.dumps({"shifts": shifts, **data}))
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
