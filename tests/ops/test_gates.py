"""Decay gates: the bounded parameterisation and the unbounded baseline."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longmoe.ops.gates import bounded_decay, kimi_decay, softplus_decay


def test_bounded_decay_formula_and_range():
    """g = g_min·sigmoid(e^A·h), strictly inside (g_min, 0) for finite h."""
    h = torch.linspace(-10, 10, 101, dtype=torch.float64).reshape(1, 101, 1).expand(1, 101, 4)
    A = torch.tensor([-1.0, 0.0, 0.5, 1.0], dtype=torch.float64).reshape(1, 4)
    g = bounded_decay(h, A, g_min=-5.0)
    torch.testing.assert_close(g, -5.0 * torch.sigmoid(A.exp() * h))
    assert (g < 0).all() and (g > -5).all()
    assert bounded_decay(torch.full((2, 3), 1e4), torch.zeros(3)).min() >= -5.0


def test_softplus_decay_formula_is_unbounded():
    """The baseline −e^A·softplus(h) grows without bound in |g|."""
    h = torch.tensor([[0.0, 100.0]])
    A = torch.zeros(2)
    g = softplus_decay(h, A)
    torch.testing.assert_close(g, -F.softplus(h))
    assert g.min() < -99


@pytest.mark.parametrize("g_min", [0.0, 1.0, "x"])
def test_bounded_decay_rejects_non_negative_g_min(g_min):
    with pytest.raises(ValueError, match="g_min: expected a negative float"):
        bounded_decay(torch.zeros(2, 3), torch.zeros(3), g_min=g_min)


@pytest.mark.parametrize(
    "h, A, match",
    [
        (torch.zeros(2, 3), torch.zeros(4), "A: expected a shape broadcastable"),
        (torch.zeros(2, 3), torch.zeros(3, dtype=torch.float64), "A: expected dtype torch.float32"),
        (torch.zeros(3), torch.zeros(3), r"h: expected shape \[..., H, K\]"),
        (torch.zeros(2, 3, dtype=torch.long), torch.zeros(3), "h: expected a floating-point tensor"),
    ],
)
@pytest.mark.parametrize("fn", [bounded_decay, softplus_decay])
def test_gate_argument_errors(fn, h, A, match):
    with pytest.raises(ValueError, match=match):
        fn(h, A)


def test_kimi_decay_formula_per_head_rate_and_bias():
    """Kimi-Linear's ``-exp(A_log)·softplus(f + dt_bias)``: one rate per head, broadcast over channels;
    unbounded below, fp32 even for bf16 input, and equal to the softplus baseline with the bias folded."""
    torch.manual_seed(0)
    f = torch.randn(2, 5, 3, 4) * 10
    A_log = torch.rand(3, 1) * 2
    dt = torch.randn(3, 4)
    g = kimi_decay(f, A_log, dt)
    assert torch.allclose(g, -A_log.exp() * F.softplus(f + dt))
    assert torch.allclose(g, softplus_decay(f + dt, A_log.expand(3, 4)))
    assert g.max() < 0 and g.min() < -30
    assert kimi_decay(f.bfloat16(), A_log.bfloat16()).dtype == torch.float32
    with pytest.raises(ValueError, match="dt_bias"):
        kimi_decay(f, A_log, torch.zeros(4))
