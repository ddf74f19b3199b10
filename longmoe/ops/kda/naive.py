"""The KDA reference: the recurrence token by token (slow, float64-able; the oracle for ``kda_chunk``)."""

from __future__ import annotations

import torch

from longmoe.ops.kda.checks import check_inputs, check_state, compute_dtype
from longmoe.ops.kda.step import kda_step


def kda_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token reference of the recurrence (slow; the oracle for ``kda_chunk``).

    Returns ``(o [B, T, H, V], final_state [B, H, K, V] or None)``.
    """
    B, T, H, K, V = check_inputs(q, k, v, g, beta)
    if initial_state is not None:
        check_state("initial_state", initial_state, (B, H, K, V), "[B, H, K, V]", q)
    cdt = compute_dtype(v.dtype)
    S = q.new_zeros(B, H, K, V, dtype=cdt) if initial_state is None else initial_state.to(cdt)
    outs = []
    for t in range(T):
        o_t, S = kda_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], S, scale=scale)
        outs.append(o_t)  # [B, H, V]
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(B, 0, H, V)
    return o, (S if output_final_state else None)
