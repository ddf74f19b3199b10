"""Routed GLU experts by gathering each (token, slot) pair's expert weights: the static-shape path.

``dispatch_experts`` (``dispatch.py``) sorts pairs by expert and sizes its tiers from the routing, so
its shapes depend on the data: under ``torch.compile`` that is a graph break and a recompile per
layout. At decode there are only ``N·k`` pairs (``k`` per request), and gathering their weights
(``N·k`` copies of ``ℓ × 2f + f × ℓ`` numbers, what the GEMMs read anyway) gives two batched
matmuls whose shapes depend on ``N`` and ``k`` alone. Forward only; tested against ``naive.py``.
"""

from __future__ import annotations

import torch

from longmoe.ops.glu import glu_act


def gather_experts(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    glu: str = "swiglu",
) -> torch.Tensor:
    """``out[n] = Σ_j weights[n, j] · GLU_{idx[n, j]}(z[n])`` with per-pair gathered weights.

    z [N, ℓ]; idx, weights [N, k]; w_in [E, ℓ, 2f]; w_out [E, f, ℓ] -> out [N, ℓ]. Memory ``O(N·k·ℓ·f)``:
    meant for small ``N·k`` (decode).
    """
    N, k = idx.shape
    flat = idx.reshape(-1)  # [N·k]
    wi = w_in.index_select(0, flat)  # [N·k, ℓ, 2f]
    wo = w_out.index_select(0, flat)  # [N·k, f, ℓ]
    x = z.repeat_interleave(k, dim=0).unsqueeze(1)  # [N·k, 1, ℓ]
    a = glu_act(torch.bmm(x, wi), glu) * weights.reshape(-1, 1, 1).to(z.dtype)  # [N·k, 1, f]
    return torch.bmm(a, wo).view(N, k, -1).sum(1)  # [N, ℓ]
