"""``causal_after_prefix``: a chunk's causal attention after cached rows, as two fused calls merged by
their log-sum-exps, against the one masked call (``causal_after_prefix_reference``)."""

from __future__ import annotations

import pytest
import torch

from longmoe.ops.attention import causal_after_prefix, causal_after_prefix_reference


def qkv(B, H, P, T, Dk, Dv, *, seed=0, logit_scale=1.0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    q = r(B, H, T, Dk) * logit_scale
    return q.to(dtype), r(B, H, P + T, Dk).to(dtype), r(B, H, P + T, Dv).to(dtype)


@pytest.mark.parametrize(("P", "T"), [(0, 1), (0, 37), (1, 1), (5, 1), (64, 64), (300, 17), (17, 300)])
@pytest.mark.parametrize(("Dk", "Dv"), [(24, 16), (16, 16)])
def test_equals_the_masked_call(P, T, Dk, Dv):
    q, k, v = qkv(2, 3, P, T, Dk, Dv, seed=P + T)
    with torch.no_grad():
        got = causal_after_prefix(q, k, v, P, scale=0.3)
        ref = causal_after_prefix_reference(q, k, v, P, scale=0.3)
    assert got.shape == (2, 3, T, Dv)
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=1e-5)


def test_peaked_scores_and_a_long_prefix():
    """Logits in the hundreds (the softmax puts nearly all mass on one key, in the prefix or in the
    chunk) and 4,000 cached rows: the log-sum-exp merge neither overflows nor loses the winner. Against
    float64: at such logits fp32 rounding alone (of either form) is ~1e-5."""
    q, k, v = qkv(1, 2, 4000, 96, 32, 24, seed=1, logit_scale=40.0)
    with torch.no_grad():
        got = causal_after_prefix(q, k, v, 4000)
        exact = causal_after_prefix_reference(q.double(), k.double(), v.double(), 4000)
        masked = causal_after_prefix_reference(q, k, v, 4000)
    assert torch.isfinite(got).all()
    err = (got.double() - exact).abs().max()
    assert err < 1e-4 and err < 4 * (masked.double() - exact).abs().max()


def test_bf16_stays_within_bf16_rounding():
    q, k, v = qkv(1, 2, 200, 50, 32, 16, seed=2, dtype=torch.bfloat16)
    with torch.no_grad():
        got = causal_after_prefix(q, k, v, 200)
        ref = causal_after_prefix_reference(*(x.float() for x in (q, k, v)), 200)
    assert got.dtype == torch.bfloat16
    assert (got.float() - ref).abs().max() < 3e-2


def test_gradients_go_through_the_reference():
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 10, 6, 16, 8, seed=3))
    causal_after_prefix(q, k, v, 10).sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    causal_after_prefix_reference(q, k, v, 10).sum().backward()
    for g, x in zip(grads, (q, k, v)):
        torch.testing.assert_close(g, x.grad)


def test_the_fused_path_runs_without_gradients_on_cpu(monkeypatch):
    """The equalities above compare the fused path, not the reference with itself."""
    from longmoe.ops.attention import prefix

    def refuse(*a, **k):
        raise AssertionError("the reference ran")

    monkeypatch.setattr(prefix, "causal_after_prefix_reference", refuse)
    q, k, v = qkv(1, 2, 30, 7, 24, 16)
    with torch.no_grad():
        assert prefix.causal_after_prefix(q, k, v, 30).shape == (1, 2, 7, 16)


def test_key_rows_must_be_prefix_plus_chunk():
    q, k, v = qkv(1, 1, 4, 3, 8, 8)
    with pytest.raises(ValueError, match="prefix"):
        causal_after_prefix(q, k, v, 5)
