"""Absorbed-MLA attention against a latent cache: every head attends over the *same* rows, and a
chunk's queries see the cached prefix plus the new rows up to their own, without a ``[T, S]`` mask.

With ``W_uk`` folded into the queries and ``W_uv`` into the output (``layers/mla.py``), keys and values
of all heads are the cache rows ``[c | k_r]`` themselves (``C = d_c + d_r`` numbers a token). Query
``t`` of a ``T``-token chunk after ``P`` cached rows may see rows ``j ≤ P + t``. The obvious call is
one masked attention over ``[T, P + T]``, which the CPU's fused (flash) kernel does not take: PyTorch
falls to its unfused path, which materialises the boolean mask and ``[H, T, P + T]`` scores (at
4,096 × 262,144 that is 1 GiB of mask and several GiB of scores per chunk, growing with the context).

``latent_attention`` runs fused, mask-free calls instead and merges them by their log-sum-exps (the
flash-decoding merge):

- the prefix ``[0, P)``: every query sees all of it, so the heads fold into the query axis
  (``[B, 1, H·T, C]``: the rows are read once, not once per head), cut along ``P`` into ``splits``
  pieces that the kernel runs in parallel as if they were heads (a decode step has one or two
  queries: without the split, one thread walks the whole cache);
- the new block ``[P, P + T)``: per head, ``is_causal`` (square, so its top-left alignment is right).

``latent_attention_reference`` is the one masked call, the oracle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_SPLIT_ROWS = 4096  # cached rows below which a split piece is not worth a kernel task
MAX_SPLITS = 64  # pieces the prefix is cut into at most (decode-sized calls)
FOLDED_QUERIES_SPLIT = 256  # H·T up to which the prefix is split (beyond: the query blocks parallelise)


def latent_attention_reference(
    q: torch.Tensor, rows: torch.Tensor, prefix: int, *, scale: float | None = None
) -> torch.Tensor:
    """One attention call with the explicit ``[T, P + T]`` mask ``j ≤ P + t`` (per-head view of the
    rows)."""
    B, H, T, C = q.shape
    S = rows.shape[1]
    kv = rows.unsqueeze(1).expand(B, H, S, C)
    i = torch.arange(T, device=q.device)[:, None]
    j = torch.arange(S, device=q.device)[None, :]
    return F.scaled_dot_product_attention(q, kv, kv, attn_mask=j <= prefix + i, scale=scale)


def split_count(prefix: int, queries: int) -> int:
    """Pieces the ``prefix`` rows are cut into for ``queries`` folded queries (see the module note)."""
    if queries > FOLDED_QUERIES_SPLIT:
        return 1
    return max(1, min(MAX_SPLITS, prefix // MIN_SPLIT_ROWS))


def latent_attention(
    q: torch.Tensor, rows: torch.Tensor, prefix: int, *, scale: float | None = None, splits: int | None = None
) -> torch.Tensor:
    """``q [B, H, T, C]`` against cache rows ``rows [B, P + T, C]`` (keys and values of every head; the
    first ``P = prefix`` are cached, the last ``T`` new) -> ``[B, H, T, C]``, query ``t`` seeing rows
    ``j ≤ P + t``. ``splits``: pieces of the prefix (default ``split_count``).

    Fused on CPU without autograd; elsewhere, or with gradients to carry, the reference.
    """
    B, H, T, C = q.shape
    S = rows.shape[1]
    if prefix < 0 or prefix + T != S or rows.shape[0] != B or rows.shape[2] != C:
        raise ValueError(f"rows: expected [{B}, {prefix} + {T}, {C}], got {list(rows.shape)}")
    grads = torch.is_grad_enabled() and (q.requires_grad or rows.requires_grad)
    if q.device.type != "cpu" or grads or T == 0:
        return latent_attention_reference(q, rows, prefix, scale=scale)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    scale = C**-0.5 if scale is None else scale
    rows = rows.to(q.dtype)
    new = rows[:, prefix:].unsqueeze(1).expand(B, H, T, C)  # [B, H, T, C] (a view)
    o_new, lse_new = flash(q, new, new, is_causal=True, scale=scale)  # [B, H, T, C], [B, H, T]
    if prefix == 0:
        return o_new
    qf = q.reshape(B, 1, H * T, C)  # heads folded: every query sees the whole prefix
    # `full` pieces of `piece` rows, then a tail of 1..piece rows: the same calls at every length
    n = splits or split_count(prefix, H * T)
    piece = max(1, -(-(prefix - 1) // n))
    full = (prefix - 1) // piece
    tail = rows[:, full * piece : prefix].unsqueeze(1)  # [B, 1, rest, C]
    o_tail, lse_tail = flash(qf, tail, tail, scale=scale)  # [B, 1, H·T, C], [B, 1, H·T]
    outs, lses = [o_tail, o_new.reshape(B, 1, H * T, C)], [lse_tail, lse_new.reshape(B, 1, H * T)]
    if full:
        kv = rows[:, : full * piece].view(B, full, piece, C)  # [B, full, piece, C]
        o, lse = flash(qf.expand(B, full, H * T, C), kv, kv, scale=scale)  # [B, full, H·T, C], [B, full, H·T]
        outs.append(o)
        lses.append(lse)
    # the flash-decoding merge, in fp32: Σ_i exp(lse_i - m) o_i / Σ_i exp(lse_i - m) over the pieces
    w = torch.softmax(torch.cat(lses, dim=1).float(), dim=1).unsqueeze(-1)  # [B, n + 2, H·T, 1]
    o = (w * torch.cat(outs, dim=1).float()).sum(dim=1)  # [B, H·T, C]
    return o.view(B, H, T, C).to(q.dtype)
