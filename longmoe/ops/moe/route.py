"""Sigmoid routing for the sparse MoE (docs/design.md §1.5): which ``k`` experts each token goes to, and the
combine weights.

``route`` selects on the *biased* scores ``sigmoid(logits) + bias`` (ties toward the lower expert index,
``topk_lowest_index``; with ``n_group > 1`` only inside each token's best groups, ``mask_to_top_groups``)
and weights by the *unbiased* selected scores, renormalised (``combine_weights``).
``selected_logits`` is the differentiable gather of the selected router logits whose backward touches
only the ``k`` selected experts per token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def topk_lowest_index(v: torch.Tensor, k: int, static: bool = False) -> torch.Tensor:
    """Indices of the ``k`` largest entries per row, ties broken toward the lower index, ascending order.

    ``torch.topk`` does not specify which of several equal values it returns; routing must be
    reproducible, so rows with a tie across the k-th boundary are redone with an explicit rule.
    ``static=True`` applies the rule to every row without a data-dependent branch (same result; what
    a ``torch.compile``'d decode step needs, see ``_lowest_index_rule``).
    """
    # v: [N, E] -> [N, k] long
    N, E = v.shape
    if k == E:
        return torch.arange(E, device=v.device).expand(N, E).clone()
    vals, idx = torch.topk(v, k + 1, dim=-1)  # [N, k+1], sorted descending
    if static:
        return _lowest_index_rule(v, vals[:, k - 1 : k], k)
    idx = idx[:, :k]
    tie = vals[:, k - 1] == vals[:, k]  # [N] rows where the boundary value is shared
    if bool(tie.any()):
        rows = tie.nonzero().squeeze(1)
        vr = v[rows]  # [R, E]
        thr = vals[rows, k - 1 : k]  # [R, 1]
        gt = vr > thr
        eq = vr == thr
        need = k - gt.sum(-1, keepdim=True)  # [R, 1] how many tied entries to take, lowest index first
        take = eq & (torch.cumsum(eq.to(torch.int32), dim=-1) <= need)
        sel = (gt | take).nonzero()[:, 1].view(-1, k)  # row-major: ascending index within each row
        idx = idx.clone()
        idx[rows] = sel
    return idx.sort(dim=-1).values


def _lowest_index_rule(v: torch.Tensor, thr: torch.Tensor, k: int) -> torch.Tensor:
    """The explicit rule for all rows at once: entries above the k-th value ``thr [N, 1]``, then the
    lowest-index entries equal to it; returned ascending. Shapes depend on ``N, E, k`` only."""
    E = v.shape[1]
    gt, eq = v > thr, v == thr
    need = k - gt.sum(-1, keepdim=True)  # [N, 1]
    take = gt | (eq & (torch.cumsum(eq.to(torch.int32), dim=-1) <= need))  # exactly k per row
    rank = take.to(torch.int64) * (E - torch.arange(E, device=v.device))  # selected: E - index > 0
    return torch.topk(rank, k, dim=-1).indices.sort(dim=-1).values


def mask_to_top_groups(biased: torch.Tensor, n_group: int, topk_group: int) -> torch.Tensor:
    """Grouped top-k (DeepSeek-V3, Kimi-Linear): keep only each token's ``topk_group`` best groups.

    ``biased``: ``[N, E]`` selection scores, experts in ``n_group`` contiguous equal groups. A group's
    score is the sum of its two best entries (its best one for groups of one expert); the experts of the
    other groups are set to ``-inf`` so a top-k over the result picks inside the kept groups. Ties between
    groups go to the lower group index, as in ``topk_lowest_index``.
    """
    N, E = biased.shape
    grouped = biased.view(N, n_group, E // n_group)  # [N, n_group, E/n_group]
    group_score = grouped.topk(min(2, E // n_group), dim=-1).values.sum(-1)  # [N, n_group]
    keep = torch.zeros(N, n_group, dtype=torch.bool, device=biased.device)
    keep.scatter_(1, topk_lowest_index(group_score, topk_group), True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(N, E)


def route(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    routed_scale: float = 1.0,
    n_group: int = 1,
    topk_group: int = 1,
    static: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sigmoid router: select on ``scores + bias``, weight by the unbiased selected scores renormalised.

    With ``n_group > 1`` selection is grouped (``mask_to_top_groups``): only experts of the token's
    ``topk_group`` best groups can be picked.

    Returns ``(scores [N, E] fp32, idx [N, k] long, weights [N, k] fp32)``. ``bias`` never reaches the
    weights, and selection is not differentiable, so the bias gets no gradient by construction.
    ``static``: see ``topk_lowest_index``.
    """
    scores = torch.sigmoid(logits.float())  # [N, E]
    with torch.no_grad():
        biased = scores + bias.float()
        if n_group > 1:
            biased = mask_to_top_groups(biased, n_group, topk_group)
        idx = topk_lowest_index(biased, top_k, static)  # [N, k]
    return scores, idx, combine_weights(scores.gather(1, idx), routed_scale)  # w [N, k]


class _SelectedLogits(torch.autograd.Function):
    """``logits.gather(1, idx)`` for ``logits = x Wᵀ``, differentiable in ``x`` and ``W`` with a sparse
    backward: only the ``k`` selected entries per token carry gradient, so ``dx = Σ_j g[n, j] W[idx]``
    (one ``embedding_bag``) and ``dW`` is a scatter of ``k`` rank-1 terms per token: O(N·k·d) instead of
    the dense router's two O(N·E·d) GEMMs (at E = 896, k = 8, 112× less work).
    """

    @staticmethod
    def forward(ctx, x, weight, logits, idx):
        # x [N, d]; weight [E, d]; logits [N, E] (computed without grad); idx [N, k] -> [N, k] fp32
        ctx.save_for_backward(x, weight, idx)
        return logits.gather(1, idx)

    @staticmethod
    def backward(ctx, g):
        x, weight, idx = ctx.saved_tensors
        N, k = idx.shape
        g = g.float().contiguous()  # [N, k]
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = F.embedding_bag(idx, weight.float(), per_sample_weights=g, mode="sum").to(x.dtype)
        if ctx.needs_input_grad[1]:
            tok = torch.arange(N, device=x.device).repeat_interleave(k)
            G = torch.sparse_coo_tensor(
                torch.stack([idx.reshape(-1), tok]),
                g.reshape(-1),
                (weight.shape[0], N),
                check_invariants=False,
            )
            dw = torch.sparse.mm(G, x.float()).to(weight.dtype)  # [E, d]
        return dx, dw, None, None


def selected_logits(
    x: torch.Tensor, weight: torch.Tensor, logits: torch.Tensor, idx: torch.Tensor
) -> torch.Tensor:
    """The router logits of the selected experts, ``(x Wᵀ).gather(1, idx)`` [N, k] fp32, whose backward
    touches only the selected experts. ``logits`` is the no-grad ``x Wᵀ`` already computed for selection."""
    return _SelectedLogits.apply(x, weight, logits, idx)


def combine_weights(selected: torch.Tensor, routed_scale: float = 1.0) -> torch.Tensor:
    """Combine weights from the *unbiased* selected scores [N, k]: renormalised to 1, times the scale.

    The ``1e-20`` keeps a token whose selected sigmoid scores all underflow to 0 (logits below ~−104,
    reachable when the bias picks experts) at weight 0 instead of 0/0 = NaN.
    """
    return selected / (selected.sum(-1, keepdim=True) + 1e-20) * routed_scale
