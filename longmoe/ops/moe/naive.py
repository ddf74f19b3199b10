"""The dense MoE reference: every expert on every token, masked by the routing.

O(N·E) work and memory; slow, obviously correct, the oracle ``dispatch_experts`` (``ops/moe/dispatch.py``)
is tested against.
"""

from __future__ import annotations

import torch

from longmoe.ops.glu import glu_act


def dense_reference(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    glu: str = "swiglu",
) -> torch.Tensor:
    """Every expert on every token, masked by the routing: O(N·E) work; the oracle for the dispatch."""
    N, k = idx.shape
    E = w_in.shape[0]
    h = torch.einsum("nl,elh->enh", z, w_in)  # [E, N, 2f]
    y = torch.einsum("enf,efl->enl", glu_act(h, glu), w_out)  # [E, N, l]
    gate = torch.zeros(N, E, dtype=weights.dtype, device=z.device)
    gate = gate.scatter_add(1, idx, weights)  # [N, E]
    return torch.einsum("ne,enl->nl", gate.to(y.dtype), y)
