"""The exact in-chunk products of KDA for unbounded gates, where ``(Q⊙e^Γ)(K⊙e^{−Γ})ᵀ`` overflows.

Both functions return what the factorised product returns, ``[N, G, 2C, C]``: rows ``i`` of ``[K | Q]``
against keys ``j`` of the same chunk, entry ``Σ_c X_i[c] K_j[c] e^{Γ_i[c] − Γ_j[c]}`` for ``j ≤ i`` and 0
above the diagonal, without ever forming a positive exponent. ``Γ_i − Γ_j = Σ_{j<t≤i} g_t`` is always a
direct sum of log-decays, never a difference of prefix sums: an unbounded gate puts prefix sums at −10⁴
and beyond, where an fp32 difference loses the small decays after them (10⁻⁴ output errors, measured).

- ``intra_logspace``: every pair through a ``[C, C, K]`` elementwise product (the simple exact form);
- ``intra_subchunk``: the chunk halved, and halved again, down to sub-chunks of ``S`` tokens (secondary
  chunking, as fla does it for its 64-token chunks, taken to every level): pairs in different halves
  as GEMMs, log space only on the diagonal ``[S, S, K]`` blocks (none at ``S = 1``, the default).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_LOGSPACE_SLAB = 1 << 24  # elements of the [n, G, C, C, K] pairwise decays formed at once (64 MB fp32)
# S = 1 (halve down to single tokens: no log space at all): the in-chunk products of a 2,048-token chunk of
# the 0.3B benchmark model (8 heads, K 128) took 33 ms at 2 threads, S = 2: 66, 4: 140, 8: 238, pairwise 380
DEFAULT_SUBCHUNK = 1


def intra_logspace(kq: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``[K | Q] ⊙ e^Γ (K ⊙ e^{−Γ})ᵀ`` on and below the diagonal from pairwise decays.

    ``kq``: ``[N, G, 2, C, K]`` (K rows then Q rows), ``g``: ``[N, G, C, K]`` per-token log-decays.
    ``Σ_{j<t≤i} g_t`` is a masked cumulative sum. Returns ``[N, G, 2C, C]``, built in slabs of chunks
    so the ``[C, C, K]`` decays stay within ``_LOGSPACE_SLAB`` elements.
    """
    N, G, _, C, K = kq.shape
    ones = torch.ones(C, C, dtype=torch.bool, device=kq.device)
    after = torch.triu(ones, diagonal=1)[..., None]  # [C(j), C(t), 1]  t > j: g_t counts from j on
    above = torch.tril(ones, diagonal=-1)[..., None]  # [C(j), C(i), 1]  i < j: above the diagonal
    step = max(1, _LOGSPACE_SLAB // max(1, G * C * C * K))
    out = []
    for n0 in range(0, N, step):
        gs = g[n0 : n0 + step].unsqueeze(-3)  # [n, G, 1, C(t), K]
        span = torch.where(after, gs, 0.0).cumsum(-2)  # [n, G, C(j), C(i), K]  Σ_{j<t≤i} g_t
        decay = span.masked_fill(above, float("-inf")).exp().transpose(-2, -3)  # [n, G, C(i), C(j), K]
        x = kq[n0 : n0 + step]  # [n, G, 2, C, K]
        kj = x[:, :, 0].unsqueeze(-3)  # [n, G, 1, C, K]  key j
        prod = (x.unsqueeze(-2) * (decay.unsqueeze(2) * kj.unsqueeze(2))).sum(-1)  # [n, G, 2, C, C]
        out.append(prod.flatten(2, 3))
    return torch.cat(out)  # [N, G, 2C, C]


def suffix_after(g: torch.Tensor) -> torch.Tensor:
    """``Σ_{t>j} g_t`` along dim −2, each a direct sum (a reversed cumulative sum, not total − prefix)."""
    return F.pad(g[..., 1:, :], (0, 0, 0, 1)).flip(-2).cumsum(-2).flip(-2)


def intra_subchunk(kq: torch.Tensor, g: torch.Tensor, sub: int = DEFAULT_SUBCHUNK) -> torch.Tensor:
    """The same products by halving: ``~log2(C/S)`` GEMM levels and log space on ``[S, S, K]`` blocks only.

    The chunk is split into halves, each half into halves, down to sub-chunks of ``S = sub`` tokens. For
    ``i`` in the second half of a block and ``j`` in its first half, the decay splits at the boundary
    between them into two sums, each ≤ 0 and each summed directly::

        Σ_{j<t≤i} g_t = L_i + R_j,   L_i = Σ_{t in i's half, t ≤ i} g_t,   R_j = Σ_{t in j's half, t > j} g_t

    so that off-diagonal quarter of the block is one GEMM ``(X⊙e^{L})(K⊙e^{R})ᵀ`` with every factor in
    [0, 1] (an underflowed factor means an underflowed product). Every level reads ``[C, K]``-sized
    tensors, where the pairwise form reads ``[C, C, K]``. The ``S × S`` blocks on the diagonal go through
    ``intra_logspace`` (with ``S = 1``: ``X_i · K_i``). ``C/S`` must be a power of two; otherwise (or for
    ``C ≤ S``) this is ``intra_logspace``. Shapes as ``intra_logspace``.
    """
    N, G, _, C, K = kq.shape
    S = sub
    if S < 1 or C % S or C <= S or (C // S) & (C // S - 1):
        return intra_logspace(kq, g)
    kq, g = kq.contiguous(), g.contiguous()  # (no-ops for kda_chunk's buffers) the views below split C
    out = kq.new_zeros(N, G, 2, C, C)  # [N, G, 2, C(i), C(j)]
    h = C // 2
    while h >= S:  # blocks of 2h tokens: rows in the second half against keys in the first
        P = C // (2 * h)
        gv = g.view(N, G, P, 2, h, K)
        # [N, G, 2, P, h, K]: K and Q rows of each block's second half ⊙ e^{L}
        left = kq.view(N, G, 2, P, 2, h, K)[:, :, :, :, 1] * gv[:, :, None, :, 1].cumsum(-2).exp()
        keys = (  # [N, G, 1, P, h, K]: keys of each block's first half ⊙ e^{R}
            kq[:, :, 0].reshape(N, G, 1, P, 2, h, K)[:, :, :, :, 0] * suffix_after(gv[:, :, None, :, 0]).exp()
        )
        blk = left @ keys.transpose(-1, -2)  # [N, G, 2, P, h(i), h(j)]
        quarter = out.view(N, G, 2, P, 2, h, P, 2, h)[:, :, :, :, 1, :, :, 0].diagonal(dim1=3, dim2=5)
        quarter.copy_(blk.permute(0, 1, 2, 4, 5, 3))  # [N, G, 2, h, h, P]
        h //= 2
    M = C // S  # the diagonal S × S blocks
    if S == 1:
        diag = (kq * kq[:, :, :1]).sum(-1).view(N, G, 2, C, 1, 1)  # [N, G, 2, C, 1, 1]  X_i · K_i
    else:
        xs = kq.view(N, G, 2, M, S, K).transpose(2, 3).reshape(N, G * M, 2, S, K)
        diag = intra_logspace(xs, g.reshape(N, G * M, S, K)).view(N, G, M, 2, S, S).transpose(2, 3)
    out.view(N, G, 2, M, S, M, S).diagonal(dim1=3, dim2=5).copy_(diag.permute(0, 1, 2, 4, 5, 3))
    return out.view(N, G, 2 * C, C)
