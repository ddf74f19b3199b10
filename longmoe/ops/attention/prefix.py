"""Causal attention of a chunk of new queries after a cached prefix (a chunked prefill's attention).

The ``T`` queries of a chunk see every one of the ``P`` cached rows and the new rows up to their own:
keys ``j ≤ P + t``. One masked call computes the whole ``[T, P + T]`` rectangle, the masked upper half of
the new block included, and the CPU's fused (flash) kernel takes neither a mask it can skip by nor value
heads narrower than the key heads (NoPE MLA: ``Dk = 192``, ``Dv = 128``), so such a call falls back to
the unfused path that forms ``[T, P + T]`` scores. ``causal_after_prefix`` runs two fused calls instead,
the prefix without a mask and the new block with ``is_causal`` (its skipped half is never computed), and
merges them by their log-sum-exps; values are zero-padded to the key width for the kernel.
``causal_after_prefix_reference`` is the one masked call, the oracle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_after_prefix_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, *, scale: float | None = None
) -> torch.Tensor:
    """One attention call with the explicit ``[T, P + T]`` mask ``j ≤ P + t``."""
    T, S = q.shape[-2], k.shape[-2]
    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=j <= prefix + i, scale=scale)


def causal_after_prefix(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, *, scale: float | None = None
) -> torch.Tensor:
    """``q [B, H, T, Dk]``, ``k [B, H, P + T, Dk]``, ``v [B, H, P + T, Dv]`` with ``P = prefix`` cached rows
    first -> ``[B, H, T, Dv]``, query ``t`` attending to keys ``j ≤ P + t``.

    Fused on CPU without autograd (``Dv ≤ Dk``); elsewhere, or with gradients to carry (the fused op's
    log-sum-exp has none), the reference.
    """
    T, S, Dk, Dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if prefix + T != S or prefix < 0:
        raise ValueError(f"k: expected prefix + T = {prefix} + {T} rows, got {S}")
    grads = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    if q.device.type != "cpu" or grads or Dv > Dk or T == 0:
        return causal_after_prefix_reference(q, k, v, prefix, scale=scale)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    scale = Dk**-0.5 if scale is None else scale
    vp = F.pad(v, (0, Dk - Dv)) if Dv < Dk else v  # [B, H, S, Dk]: zero columns, the kernel's one width
    o_new, lse_new = flash(q, k[..., prefix:, :], vp[..., prefix:, :], is_causal=True, scale=scale)
    if prefix == 0:
        return o_new[..., :Dv]
    o_old, lse_old = flash(q, k[..., :prefix, :], vp[..., :prefix, :], scale=scale)  # [B,H,T,Dk], [B,H,T]
    w_old = torch.sigmoid(lse_old - lse_new).unsqueeze(-1)  # [B, H, T, 1] fp32: softmax mass on the prefix
    # merged in fp32 (the kernel's outputs are already rounded to q's dtype; a bf16 merge adds a rounding)
    return torch.lerp(o_new.float(), o_old.float(), w_old)[..., :Dv].to(q.dtype)
