"""One token of the KDA recurrence: the decode path (``S' = Diag(e^g) S``, ``S += β k (v − S'ᵀk)ᵀ``,
``o = scale · Sᵀq``), O(K·V) per head whatever the context length."""

from __future__ import annotations

import torch

from longmoe.ops.kda.checks import check_state, check_tensor, compute_dtype, resolve_scale


def kda_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of the recurrence (decode): returns ``(o [B, H, V], new_state [B, H, K, V])``.

    ``q, k, g``: ``[B, H, K]``; ``v``: ``[B, H, V]``; ``beta``: ``[B, H]``; ``state``: ``[B, H, K, V]``.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 3 or not q.is_floating_point():
        raise ValueError(
            f"q: expected a floating-point tensor of shape [B, H, K], got {getattr(q, 'shape', q)}"
        )
    B, H, K = q.shape
    if not isinstance(v, torch.Tensor) or v.dim() != 3:
        raise ValueError(f"v: expected a tensor of shape [B, H, V], got {getattr(v, 'shape', type(v))}")
    V = v.shape[-1]
    check_tensor("k", k, (B, H, K), "[B, H, K]", q)
    check_tensor("v", v, (B, H, V), "[B, H, V]", q)
    check_tensor("g", g, (B, H, K), "[B, H, K]", q)
    check_tensor("beta", beta, (B, H), "[B, H]", q)
    check_state("state", state, (B, H, K, V), "[B, H, K, V]", q)
    scale = resolve_scale(scale, K)
    out_dtype, cdt = v.dtype, compute_dtype(v.dtype)
    q, k, v, g, beta = (x.to(cdt) for x in (q, k, v, g, beta))
    # products as matmuls of [.., 1, K] rows and an outer product as addcmul: the same arithmetic as
    # the einsums they replace, without einsum's Python parsing (a decode step makes these per layer)
    S = state.to(cdt) * g.exp().unsqueeze(-1)  # [B, H, K, V]   S' = Diag(e^g) S
    pred = (k.unsqueeze(-2) @ S).squeeze(-2)  # [B, H, V]      S'ᵀ k
    u = beta.unsqueeze(-1) * (v - pred)  # [B, H, V]
    S = torch.addcmul(S, k.unsqueeze(-1), u.unsqueeze(-2))  # S' + β k (v − S'ᵀk)ᵀ
    o = scale * (q.unsqueeze(-2) @ S).squeeze(-2)  # [B, H, V]
    return o.to(out_dtype), S
