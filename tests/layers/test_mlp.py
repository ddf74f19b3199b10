"""One GLU everywhere: the dense MLP, a shared expert and a routed expert with identical weights compute
the same function (they all call ops/glu.py)."""

from __future__ import annotations

import pytest
import torch

from longmoe.config import FFNConfig
from longmoe.layers.mlp import GLUMLP
from longmoe.layers.moe import MoELayer
from longmoe.ops.glu import GLUS
from longmoe.ops.moe import IMPLS, dense_reference, dispatch_experts

TOL = dict(rtol=1e-6, atol=1e-6)  # fp32: only the GEMMs' summation order differs


@pytest.mark.parametrize("glu", GLUS)
def test_dense_shared_and_routed_experts_compute_one_function(glu):
    d, f, N = 16, 24, 50
    torch.manual_seed(0)
    mlp = GLUMLP(d, f, glu)
    cfg = FFNConfig(kind="moe", glu=glu, n_experts=1, top_k=1, n_shared=1, expert_hidden=f, shared_hidden=f)
    moe = MoELayer(d, cfg).eval()
    with torch.no_grad():  # the same weights in all three places ([E, in, out] for the routed experts)
        moe.shared.w_in.weight.copy_(mlp.w_in.weight)
        moe.shared.w_out.weight.copy_(mlp.w_out.weight)
        moe.w_in[0].copy_(mlp.w_in.weight.T)
        moe.w_out[0].copy_(mlp.w_out.weight.T)
    x = torch.randn(N, d, requires_grad=True)
    dense = mlp(x)
    torch.testing.assert_close(moe.shared(x), dense, **TOL)
    idx, w = torch.zeros(N, 1, dtype=torch.long), torch.ones(N, 1)
    for impl in IMPLS:
        routed = dispatch_experts(x, idx, w, moe.w_in, moe.w_out, glu, impl)
        torch.testing.assert_close(routed, dense, **TOL)
        # the routed experts' hand backward (bmm) and autograd (grouped_mm) give the dense MLP's dx
        dy = torch.randn(N, d, generator=torch.Generator().manual_seed(1))
        (gx,) = torch.autograd.grad(routed, x, dy)
        (rx,) = torch.autograd.grad(mlp(x), x, dy)
        torch.testing.assert_close(gx, rx, **TOL)
    torch.testing.assert_close(dense_reference(x, idx, w, moe.w_in, moe.w_out, glu), dense, **TOL)
    # the whole layer: one expert at combine weight 1 plus the shared expert = twice the dense MLP
    torch.testing.assert_close(moe(x), 2 * dense, **TOL)


def test_unknown_glu_is_rejected():
    with pytest.raises(ValueError, match="glu: expected one of"):
        GLUMLP(8, 8, "reglu")
