"""The one GLU (ops/glu.py): the activation forms, and the hand backward the routed experts use."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from longmoe.config import GLU_KINDS
from longmoe.ops.glu import GLUS, glu_act, glu_act_backward


def _h(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(4, 7, 2 * 10, generator=g, dtype=torch.float64)).to(dtype)


def test_the_kinds_are_the_configs():
    assert tuple(GLUS) == tuple(GLU_KINDS)


def test_forms_swiglu_is_silu_and_geglu_is_the_exact_erf_gelu():
    """geglu = x·Φ(x) with the erf Φ (F.gelu's default), not the tanh approximation."""
    h = _h(torch.float64)
    g, u = h.chunk(2, dim=-1)
    torch.testing.assert_close(glu_act(h, "swiglu"), g * torch.sigmoid(g) * u, rtol=1e-12, atol=1e-12)
    exact = g * 0.5 * (1 + torch.erf(g / math.sqrt(2))) * u
    torch.testing.assert_close(glu_act(h, "geglu"), exact, rtol=1e-12, atol=1e-12)
    tanh = F.gelu(g, approximate="tanh") * u
    assert (glu_act(h, "geglu") - tanh).abs().max() > 1e-5  # the approximation is a different function


@pytest.mark.parametrize("glu", GLUS)
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_hand_backward_matches_autograd(glu, dtype, tol):
    h = _h(dtype, seed=1).requires_grad_()
    out = glu_act(h, glu)
    da = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(dtype)
    (ref,) = torch.autograd.grad(out, h, da)
    got = glu_act_backward(h.detach(), da, glu)
    assert got.shape == h.shape and got.dtype == dtype
    torch.testing.assert_close(got, ref, rtol=tol, atol=tol)


def test_unknown_glu_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match=r"glu: expected one of \['geglu', 'swiglu'\], got 'relu'"):
        glu_act(torch.zeros(2, 4), "relu")
    with pytest.raises(ValueError, match="glu: expected one of"):
        glu_act_backward(torch.zeros(2, 4), torch.zeros(2, 2), "relu")
