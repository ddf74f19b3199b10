"""Dropless dispatch of the routed GLU experts (docs/design.md §1.5) as a pure tensor function.

``dispatch_experts`` runs the selected GLU experts (``ops/glu.py``) for every (token, expert) pair the
router chose (``ops/moe/route.py``), with no Python loop over experts and no dropped tokens.
``ops/moe/naive.py`` is the slow, obviously correct oracle it is tested against.

Dispatch layout ("tiered padded bmm", ``Layout``). Pairs are sorted by expert (stable) and written into
zero-padded expert-major row blocks by one gather. Tier 1 gives every expert ``C1`` rows and runs as
``torch.bmm`` over the weights as stored; the few experts with more pairs continue in later tiers over
only those experts (their weights gathered). Tier sizes come from a tiny dynamic programme on the
counts, so padding stays small even when the load is skewed, and the number of GEMM calls is the number
of tiers (≤ ``MAX_TIERS``), never the number of experts. Padded rows are zero: they cost FLOPs but
never change a result. On CPU a ``bmm`` at ~40 rows per expert runs ~3× faster than
``torch._grouped_mm`` (see docs/moe.md), which pays for the padding; ``impl="grouped_mm"`` uses
``torch._grouped_mm`` on the unpadded sorted rows instead.

The autograd ``Function`` writes the backward by hand in the same layout: per tier three more ``bmm``
pairs, gathered-expert gradients added in place, and no per-expert full-size buffers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longmoe.ops.glu import glu_act, glu_act_backward

PAD_MULTIPLE = 8  # rows per expert are padded to a multiple of this (SIMD-friendly GEMM tiles)
IMPLS = ("bmm", "grouped_mm")


class Layout:
    """Where every (token, slot) pair lives in the zero-padded, expert-major row layout of the bmm tiers.

    Pairs are sorted by expert (stable: within an expert, in token order). Tier 1 gives *every* expert
    ``C1`` rows (``[E, C1, ℓ]``, a strided view of the weights, nothing copied); an expert with more than
    ``C1`` pairs puts the rest in tier 2, ``[S, C2, ℓ]`` over only the ``S`` overflowing experts, whose
    weights are gathered. ``C1`` minimises padded rows plus ``GATHER_ROWS`` per gathered expert; with
    near-uniform loads tier 2 is empty. Padding rows point at a sentinel (``N`` for tokens, ``N·k`` for
    pairs) that reads an appended zero row, so padded tensors are built by one gather and no zero fill.
    """

    def __init__(self, idx: torch.Tensor, n_experts: int) -> None:
        # idx [N, k] long
        N, k = idx.shape
        M, E, dev = N * k, n_experts, idx.device
        flat = idx.reshape(-1)  # [M] pair p = token * k + slot
        e_sorted, order = torch.sort(flat, stable=True)  # [M]
        counts = torch.bincount(flat, minlength=E)  # [E]
        bounds = choose_tiers(counts)  # [0, T1, ..., Tm]: tier t holds ranks [T_t, T_{t+1})
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(M, device=dev) - starts[e_sorted]  # [M] rank of the pair within its expert
        self.tiers: list[tuple[torch.Tensor | None, int, int]] = []  # (experts or None = all, cap, row0)
        prow = torch.empty_like(pos)
        row0 = 0
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            cap = hi - lo
            if lo == 0:
                experts, slot_of_pair, n = None, e_sorted, E
            else:
                experts = (counts > lo).nonzero().squeeze(1)  # [S] experts that reach this tier
                slot = torch.zeros(E, dtype=torch.long, device=dev)
                slot[experts] = torch.arange(experts.numel(), device=dev)
                slot_of_pair, n = slot[e_sorted], experts.numel()
            here = (pos >= lo) & (pos < hi)
            prow = torch.where(here, row0 + slot_of_pair * cap + (pos - lo), prow)
            self.tiers.append((experts, cap, row0))
            row0 += n * cap
        self.row_of_pair = torch.empty_like(prow).scatter_(0, order, prow)  # [M] padded row of pair p
        self.pair_of_row = torch.full((row0,), M, dtype=torch.long, device=dev)
        self.pair_of_row[prow] = order  # [R] pair held by each padded row (M = padding)
        self.tok_of_row = torch.where(self.pair_of_row < M, self.pair_of_row // k, N)  # [R] (N = pad)
        self.N, self.k, self.E, self.rows, self.counts, self.order = N, k, E, row0, counts, order


GATHER_ROWS = 32  # cost of one gathered expert in a tier > 1 (weight copy + grad add), in padded rows
MAX_TIERS = 4
MAX_GRID = 48  # candidate tier boundaries considered by choose_tiers


def _round_up(n: int) -> int:
    return max(PAD_MULTIPLE, -(-n // PAD_MULTIPLE) * PAD_MULTIPLE)


def choose_tiers(counts: torch.Tensor) -> list[int]:
    """Tier boundaries ``[0, T1, …, Tm]`` (multiples of ``PAD_MULTIPLE``, ``Tm ≥ max count``).

    A small dynamic programme over the boundaries minimising padded rows ``Σ_t n_t·(T_{t+1} − T_t)``
    plus ``GATHER_ROWS`` per expert in tiers after the first (``n_t`` = experts with more than ``T_t``
    pairs; the first tier holds all ``E``). At most ``MAX_TIERS`` tiers.
    """
    E = counts.numel()
    top = _round_up(int(counts.max()) if E else 0)
    # the DP is O(len(grid)²) in Python: with few, large experts (E = 8, thousands of rows each) a
    # coarser grid keeps it at ~MAX_GRID points; the padding it may add is < 1/MAX_GRID of the rows
    step = PAD_MULTIPLE * max(1, -(-top // (PAD_MULTIPLE * MAX_GRID)))
    grid = list(range(0, top, step)) + [top]
    c = torch.sort(counts).values
    n_above = [E] + [int(E - torch.searchsorted(c, t, right=True)) for t in grid[1:]]
    inf = float("inf")
    best = [[inf] * (MAX_TIERS + 1) for _ in grid]  # best[j][m]: ranks [0, grid[j]) in m tiers
    back = [[0] * (MAX_TIERS + 1) for _ in grid]
    best[0][0] = 0.0
    for j in range(1, len(grid)):
        for i in range(j):
            step = n_above[i] * (grid[j] - grid[i]) + (GATHER_ROWS * n_above[i] if i else 0)
            for m in range(MAX_TIERS):
                if best[i][m] + step < best[j][m + 1]:
                    best[j][m + 1], back[j][m + 1] = best[i][m] + step, i
    j = len(grid) - 1
    m = min(range(1, MAX_TIERS + 1), key=lambda mm: best[j][mm])
    out = [grid[j]]
    while j:
        j, m = back[j][m], m - 1
        out.append(grid[j])
    return out[::-1]


def _gather_padded(src: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``cat([src, 0]).index_select(index)``: rows of ``src`` with index ``len(src)`` reading zeros."""
    ext = torch.cat([src, src.new_zeros(1, src.shape[1])])
    return ext.index_select(0, index)


def _tier_weights(w: torch.Tensor, experts: torch.Tensor | None) -> torch.Tensor:
    return w if experts is None else w.index_select(0, experts)


class _PaddedExperts(torch.autograd.Function):
    """``out[n] = Σ_j w[n, j] · GLU_{idx[n, j]}(z[n])`` via tiered padded ``bmm``; manual backward.

    The combine weight of each row scales its activation before the second GEMM, so the expert outputs
    ``yp`` are already weighted and the combine is a gather-sum of ``k`` rows per token
    (``F.embedding_bag``): no ``[N·k, ℓ]`` pair-order tensor is ever built, in either direction.
    """

    @staticmethod
    def forward(ctx, z, weights, w_in, w_out, lay, glu):
        # z [N, l]; weights [N, k]; w_in [E, l, 2f]; w_out [E, f, l] -> out [N, l]
        l = z.shape[1]
        xp = _gather_padded(z, lay.tok_of_row)  # [R, l]
        wr = _gather_padded(weights.reshape(-1, 1), lay.pair_of_row)  # [R, 1] combine weight, pads 0
        yp = torch.empty_like(xp)
        saved = []
        for experts, cap, row0 in lay.tiers:
            wi, wo = _tier_weights(w_in, experts), _tier_weights(w_out, experts)
            n, rows = wi.shape[0], slice(row0, row0 + wi.shape[0] * cap)
            h = torch.bmm(xp[rows].view(n, cap, l), wi)  # [n, C, 2f]
            aw = glu_act(h, glu) * wr[rows].view(n, cap, 1)  # [n, C, f] weighted activation
            torch.bmm(aw, wo, out=yp[rows].view(n, cap, l))
            saved += [h, aw, wi, wo]
        ctx.save_for_backward(xp, wr, *saved)
        ctx.lay, ctx.glu = lay, glu
        return F.embedding_bag(lay.row_of_pair.view(lay.N, lay.k), yp, mode="sum")  # [N, l]

    @staticmethod
    def backward(ctx, dout):
        xp, wr, *saved = ctx.saved_tensors
        lay = ctx.lay
        l = xp.shape[1]
        g = _gather_padded(dout.contiguous(), lay.tok_of_row)  # [R, l] = d yp (pads 0)
        dxp = torch.empty_like(g)
        acc = torch.promote_types(g.dtype, torch.float32)
        dwr = torch.empty(g.shape[0], dtype=acc, device=g.device)  # [R] d weight per row
        dw_in = dw_out = None
        for t, (experts, cap, row0) in enumerate(lay.tiers):
            h, aw, wi, wo = saved[4 * t : 4 * t + 4]
            n, rows = wi.shape[0], slice(row0, row0 + wi.shape[0] * cap)
            x, gy = xp[rows].view(n, cap, l), g[rows].view(n, cap, l)
            gwo = torch.bmm(aw.transpose(1, 2), gy)  # [n, f, l]
            daw = torch.bmm(gy, wo.transpose(1, 2))  # [n, C, f]
            dwr[rows] = (glu_act(h, ctx.glu).to(acc) * daw.to(acc)).sum(-1).view(-1)
            dh = glu_act_backward(h, daw * wr[rows].view(n, cap, 1), ctx.glu)  # [n, C, 2f]
            gwi = torch.bmm(x.transpose(1, 2), dh)  # [n, l, 2f]
            torch.bmm(dh, wi.transpose(1, 2), out=dxp[rows].view(n, cap, l))
            if experts is None:
                dw_in, dw_out = gwi, gwo
            else:
                dw_in.index_add_(0, experts, gwi)  # in place: the full [E, ...] grad is large
                dw_out.index_add_(0, experts, gwo)
        pairs = lay.row_of_pair.view(lay.N, lay.k)
        dz = F.embedding_bag(pairs, dxp, mode="sum")  # [N, l]: Σ over each token's k rows
        dweights = dwr[pairs].to(wr.dtype)  # [N, k]
        return dz, dweights, dw_in, dw_out, None, None


def _grouped_experts(
    xs: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor, counts: torch.Tensor, glu: str
) -> torch.Tensor:
    """The same computation with ``torch._grouped_mm`` over the unpadded sorted rows (autograd built in)."""
    offs = torch.cumsum(counts, 0).to(torch.int32)
    h = torch._grouped_mm(xs, w_in, offs=offs)
    a = glu_act(h, glu).contiguous()
    return torch._grouped_mm(a, w_out, offs=offs)


def dispatch_experts(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    glu: str = "swiglu",
    impl: str = "bmm",
) -> torch.Tensor:
    """Dropless routed GLU experts: ``out[n] = Σ_j weights[n, j] · GLU_{idx[n, j]}(z[n])``.

    z [N, ℓ]; idx, weights [N, k]; w_in [E, ℓ, 2f] (gate|up); w_out [E, f, ℓ] -> out [N, ℓ] in z.dtype.
    Differentiable in z, weights, w_in and w_out. Every pair is computed (no capacity, no drops).
    """
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    N, k = idx.shape
    lay = Layout(idx, w_in.shape[0])
    if impl == "bmm":
        return _PaddedExperts.apply(z, weights.to(z.dtype), w_in, w_out, lay, glu)  # [N, l]
    tok = lay.order // k
    ys = _grouped_experts(z.index_select(0, tok), w_in, w_out, lay.counts, glu)  # sorted order
    Y = torch.empty_like(ys).index_copy(0, lay.order, ys)  # [N*k, l] pair order
    # combine: out[n] = Σ_j w[n, j] Y[n, j]
    return torch.bmm(weights.to(Y.dtype).unsqueeze(1), Y.view(N, k, Y.shape[-1])).squeeze(1)  # [N, l]
