"""Lower bounds on the E = 896 MoE layer's time on this machine: weight traffic and GEMM throughput.

At E = 896 the routed experts hold 896 · 3 · d · f = 176M weights (705 MB fp32, 352 MB bf16) and each
expert sees only ~37 of the 4096 · 8 token-expert pairs, so a step cannot be faster than streaming
those weights through memory once per pass: the forward reads them, the backward reads them again
and writes their gradient. At E = 8 the same work touches 6 MB of weights, which stay in cache. This
script measures the memory bandwidth (a large ``copy_``, read + write) and the ``torch.mm`` peak in the
same run and sets both floors beside the layer's times from ``bench/results/moe.json``:

    floor = max(weight bytes moved / bandwidth, useful FLOPs / peak mm)

(the larger of the two, as if memory and compute overlapped perfectly; real kernels overlap less).

    python bench/moe_bound.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, gemm_roofline, markdown_table, timeit, write_results  # noqa: E402
from bench.moe import F_HID, SHARED, D, K, moe_flops  # noqa: E402
from longmoe.config import FFNConfig  # noqa: E402

E, N = 896, 4096


def copy_bandwidth(n_bytes: int = 1 << 30) -> float:
    """Peak bytes/s of ``dst.copy_(src)`` over ``n_bytes`` (counting the read and the write)."""
    src = torch.randn(n_bytes // 4)
    dst = torch.empty_like(src)
    return 2 * n_bytes / timeit(lambda: dst.copy_(src), warmup=1, iters=5, stat=min)


def main() -> int:
    measured = json.loads((RESULTS / "moe.json").read_text())["rows"]
    bw = copy_bandwidth()
    rows, payload = [], {"bandwidth_bytes_per_s": bw, "rows": []}
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        roof = gemm_roofline(dtype)
        w_bytes = E * 3 * D * F_HID * size
        cfg = FFNConfig(kind="moe", n_experts=E, top_k=K, n_shared=1, latent_ratio=1, expert_hidden=F_HID,
                        shared_hidden=SHARED)  # fmt: skip
        flops = moe_flops(N, D, cfg)  # the same useful-FLOP count as bench/moe.py

        def row_of(impl: str, dt: str = str(dtype)[6:]) -> dict:
            return next(r for r in measured if (r["E"], r["dtype"], r["α"], r["impl"]) == (E, dt, 1, impl))

        ours, peer = row_of("longmoe"), row_of("transformers grouped_mm")
        for phase, traffic, work, t_ours, t_peer in (
            ("fwd", w_bytes, flops, ours["fwd s"], peer["fwd s"]),
            # fwd+bwd: read the weights, read them again for dx, write their gradient
            ("fwd+bwd", 3 * w_bytes, 3 * flops, ours["fwd+bwd s"], peer["fwd+bwd s"]),
        ):
            floor = max(traffic / bw, work / roof)
            row = [
                str(dtype)[6:],
                phase,
                traffic / 1e6,
                traffic / bw * 1e3,
                work / roof * 1e3,
                floor * 1e3,
                t_ours * 1e3,
                t_ours / floor,
                t_peer * 1e3,
                t_peer / 2 / floor,
            ]
            rows.append(row)
            payload["rows"].append(dict(zip(HEADER, row)))
    md = (
        f"MoE layer at E = {E}, 4096 tokens, d = {D}, f = {F_HID}, k = {K}: floors from weight traffic "
        f"(copy bandwidth {bw / 1e9:.1f} GB/s, read + write) and from the peak torch.mm, "
        "both measured in this run; "
        "layer times from bench/results/moe.json. The last column is what the '2x transformers grouped_mm' "
        "target asks for, in multiples of the floor (below 1 = faster than the floor allows).\n\n"
        + markdown_table(HEADER, rows)
    )
    write_results("moe_bound", payload, md, update_readme=False)
    return 0


HEADER = [
    "dtype", "pass", "weight MB moved", "traffic floor ms", "FLOP floor ms", "floor ms", "longmoe ms",
    "longmoe / floor", "grouped_mm ms", "target (grouped_mm / 2) / floor",
]  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
