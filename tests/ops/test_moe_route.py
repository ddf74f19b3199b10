"""MoE routing (ops/moe/route.py): deterministic top-k, biased selection with unbiased weights, and the
router's sparse backward."""

from __future__ import annotations

import pytest
import torch

from longmoe.ops.moe import mask_to_top_groups, route, selected_logits, topk_lowest_index


def test_topk_ties_break_toward_lower_index_deterministically():
    """Equal scores across the k-th boundary: the lower expert indices win, identically on every call."""
    v = torch.tensor([[0.5, 0.9, 0.5, 0.5, 0.1], [0.3, 0.3, 0.3, 0.3, 0.3], [0.1, 0.2, 0.3, 0.4, 0.5]])
    for _ in range(3):
        idx = topk_lowest_index(v, 2)
        assert idx.tolist() == [[0, 1], [0, 1], [3, 4]]
    big = torch.zeros(64, 896)  # all tied: the first k experts, for every row
    assert (topk_lowest_index(big, 8) == torch.arange(8)).all()


def test_topk_static_form_equals_the_branching_form():
    """The branch-free rule (compiled decode) selects exactly what the branching one does: random rows,
    rows with ties at the boundary, all-tied rows, quantised scores full of ties."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn(64, 12, generator=g)
    v[::3] = torch.round(v[::3] * 2) / 2  # many ties
    v[5] = 0.25
    for k in (1, 2, 5, 11, 12):
        assert torch.equal(topk_lowest_index(v, k, static=True), topk_lowest_index(v, k))
    big = torch.zeros(8, 896)
    assert (topk_lowest_index(big, 8, static=True) == torch.arange(8)).all()


def test_route_bias_changes_selection_but_not_weights():
    """The bias decides which experts are chosen; weights are their unbiased scores, renormalised."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    _, idx0, w0 = route(logits, torch.zeros(4), 2)
    assert idx0.tolist() == [[0, 1]]
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0])
    scores, idx1, w1 = route(logits, bias, 2, routed_scale=2.5)
    assert idx1.tolist() == [[0, 3]]
    s = torch.sigmoid(logits[0, [0, 3]])
    torch.testing.assert_close(w1[0], 2.5 * s / s.sum())
    torch.testing.assert_close(w0.sum(-1), torch.ones(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_selected_logits_sparse_backward_equals_dense_gather(dtype):
    """The sparse router backward gives the gradients of ``(x Wᵀ).gather(1, idx)`` in x and W."""
    g = torch.Generator().manual_seed(3)
    N, E, d, k = 40, 24, 16, 5
    x = torch.randn(N, d, generator=g).to(dtype).requires_grad_()
    W = torch.randn(E, d, generator=g).to(dtype).requires_grad_()
    idx = torch.randint(0, E, (N, k), generator=g)
    idx[:, 1] = idx[:, 0]  # repeated experts in a row must accumulate, not overwrite
    up = torch.randn(N, k, generator=g)
    xr, Wr = (t.detach().float().requires_grad_() for t in (x, W))
    ref = (xr @ Wr.T).gather(1, idx)
    logits = (x.float() @ W.float().T).detach()
    out = selected_logits(x, W, logits, idx)
    torch.testing.assert_close(out, ref.detach(), atol=1e-5, rtol=1e-5)
    gx, gW = torch.autograd.grad((out * up).sum(), (x, W))
    rx, rW = torch.autograd.grad((ref * up).sum(), (xr, Wr))
    assert gx.dtype == dtype and gW.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(gx.float(), rx, atol=tol, rtol=tol)
    torch.testing.assert_close(gW.float(), rW, atol=tol, rtol=tol)


def test_combine_weights_stay_finite_when_selected_scores_underflow():
    """Logits far below −104 make sigmoid exactly 0: weights are 0 (no NaN), gradients finite."""
    logits = torch.full((3, 6), -300.0, requires_grad=True)
    _, idx, w = route(logits, torch.zeros(6), 2)
    assert torch.isfinite(w).all() and (w == 0).all()
    w.sum().backward()
    assert torch.isfinite(logits.grad).all()


def _grouped_reference(biased: torch.Tensor, n_group: int, topk_group: int, k: int) -> list[list[int]]:
    """Grouped top-k spelled out per token: rank groups by the sum of their two best scores, keep the best
    ``topk_group``, then take the ``k`` best experts among the kept ones."""
    out = []
    E = biased.shape[1]
    size = E // n_group
    for row in biased.tolist():
        groups = [sorted(row[g * size : (g + 1) * size], reverse=True) for g in range(n_group)]
        gscore = [sum(g[:2]) for g in groups]
        kept = sorted(range(n_group), key=lambda g: -gscore[g])[:topk_group]
        cand = [e for e in range(E) if e // size in kept]
        out.append(sorted(sorted(cand, key=lambda e: -row[e])[:k]))
    return out


@pytest.mark.parametrize(("n_group", "topk_group", "k"), [(4, 2, 3), (8, 3, 3), (2, 1, 4), (4, 4, 2)])
def test_grouped_routing_matches_the_spelled_out_rule(n_group, topk_group, k):
    torch.manual_seed(n_group * 10 + topk_group)
    logits, bias = torch.randn(50, 16), 0.1 * torch.randn(16)
    scores, idx, w = route(logits, bias, k, 2.0, n_group=n_group, topk_group=topk_group)
    assert idx.tolist() == _grouped_reference(scores + bias, n_group, topk_group, k)
    sel = scores.gather(1, idx)
    assert torch.allclose(w, sel / sel.sum(-1, keepdim=True) * 2.0)  # weights: unbiased, renormalised


def test_grouping_restricts_choices_and_one_group_is_plain_topk():
    biased = torch.tensor([[0.9, 0.1, 0.8, 0.7, 0.2, 0.6, 0.5, 0.4]])  # groups of 2: sums 1.0, 1.5, .8, .9
    masked = mask_to_top_groups(biased, 4, 1)
    assert torch.isinf(masked).sum() == 6 and masked[0, 2:4].tolist() == biased[0, 2:4].tolist()
    logits = torch.randn(20, 8)
    assert torch.equal(route(logits, torch.zeros(8), 2)[1], route(logits, torch.zeros(8), 2, 1.0, 1, 1)[1])
