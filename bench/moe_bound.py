"""How far the E = 896 MoE layer is from this machine's floors, and what the speed targets ask for.

At E = 896 the routed experts hold 896 · 3 · d · f = 176M weights (705 MB fp32) and each expert sees
only ~37 of the 4096 · 8 token-expert pairs. Two floors bound a step, both measured in this run:

- weight traffic: the forward streams the weights once, the backward reads them again and writes
  their gradient (bytes / the bandwidth of a large ``copy_``);
- compute: the useful FLOPs (the count of ``bench/moe.py``) at the peak 1024³ ``torch.mm``.

The layer and transformers' ``grouped_mm`` MoE block are timed in the same run (``bench/moe.py``'s
``run_case``), and the table says, in multiples of the floor, where each stands and what the
"fwd+bwd >= 2x transformers grouped_mm" target would need. bf16 rows are skipped on a CPU whose
bf16 ``torch.mm`` is not faster than fp32 (no AVX512-BF16 / AMX: a bf16 GEMM there runs a slow
reference path, and a share of it means nothing).

    python -m bench.moe_bound
"""

from __future__ import annotations

import argparse

import torch

from bench.common import gemm_roofline, markdown_table, timeit, write_results
from bench.moe import F_HID, SHARED, D, K, moe_flops, run_case
from longmoe.config import FFNConfig

E, N = 896, 4096
HEADER = [
    "dtype", "pass", "weight MB moved", "traffic floor ms", "FLOP floor ms", "longmoe ms", "longmoe / floor",
    "grouped_mm ms", "grouped_mm / floor", "2x-target ms", "2x-target / floor",
]  # fmt: skip


def copy_bandwidth(n_bytes: int = 1 << 30) -> float:
    """Peak bytes/s of ``dst.copy_(src)`` over ``n_bytes`` (counting the read and the write)."""
    src = torch.randn(n_bytes // 4)
    dst = torch.empty_like(src)
    return 2 * n_bytes / timeit(lambda: dst.copy_(src), warmup=1, iters=5, stat=min)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.parse_known_args(argv)  # one fixed size: ``make bench``'s shared flags (--quick) change nothing here
    bw = copy_bandwidth()
    cfg = FFNConfig(kind="moe", n_experts=E, top_k=K, n_shared=1, latent_ratio=1, expert_hidden=F_HID,
                    shared_hidden=SHARED)  # fmt: skip
    flops = moe_flops(N, D, cfg)
    mm = {dt: gemm_roofline(dt) for dt in (torch.float32, torch.bfloat16)}
    rows, notes = [], []
    for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
        name = str(dtype)[6:]
        if dtype == torch.bfloat16 and mm[dtype] <= mm[torch.float32]:
            notes.append(
                f"bf16 skipped: bf16 torch.mm runs at {mm[dtype] / 1e9:.1f} GFLOP/s on this CPU "
                f"(fp32 {mm[torch.float32] / 1e9:.0f}): no bf16 GEMM hardware"
            )
            continue
        timed = {r[3]: r for r in run_case(E, N, dtype, 1, iters=3, peers=True, peer_impls=("grouped_mm",))}
        ours, peer = timed["longmoe"], timed["transformers grouped_mm"]
        roof = max(ours[9], peer[9]) * 1e9  # the peak mm read around the two rows
        w_bytes = E * 3 * D * F_HID * size
        for phase, traffic, work, t_ours, t_peer in (
            ("fwd", w_bytes, flops, ours[4], peer[4]),
            ("fwd+bwd", 3 * w_bytes, 3 * flops, ours[6], peer[6]),  # read, read again for dx, write dW
        ):
            floor = max(traffic / bw, work / roof)
            rows.append([name, phase, traffic / 1e6, traffic / bw * 1e3, work / roof * 1e3,
                         t_ours * 1e3, t_ours / floor, t_peer * 1e3, t_peer / floor,
                         t_peer / 2 * 1e3, t_peer / 2 / floor])  # fmt: skip
    md = (
        f"MoE layer at E = {E}, {N} tokens, d = {D}, f = {F_HID}, k = {K}, 1 shared expert; floors from this "
        f"run: copy bandwidth {bw / 1e9:.1f} GB/s (read + write), peak torch.mm "
        f"{mm[torch.float32] / 1e9:.0f} GFLOP/s fp32. 'x / floor' = time in multiples of the larger floor; "
        "the 2x target (half of grouped_mm's time) needs the layer within that multiple of the floor."
        + "".join(f"\n{n}." for n in notes)
        + "\n\n"
        + markdown_table(HEADER, rows)
    )
    write_results("moe_bound", {"bandwidth_bytes_per_s": bw, "mm_flops": {str(k): v for k, v in mm.items()},
                                "rows": [dict(zip(HEADER, r)) for r in rows], "notes": notes}, md,
                  update_readme=False)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
