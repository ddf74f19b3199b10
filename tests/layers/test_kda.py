"""KDA layer: carried conv tail + state make any split of a sequence exact; packing keeps docs apart."""

from __future__ import annotations

import pytest
import torch

from longmoe.cache import Packing
from longmoe.config import ModelConfig
from longmoe.layers.kda import KDALayer, _causal_conv
from tests.helpers.models import small_cfg

TOL = 1e-5


def cfg(**kw) -> ModelConfig:
    return small_cfg("L", **kw)


def layer(c: ModelConfig, seed: int = 0) -> KDALayer:
    torch.manual_seed(seed)
    m = KDALayer(c)
    m.init_weights(0.2, 0.2)
    with torch.no_grad():
        m.A.normal_(0.0, 0.5)  # non-trivial gate scale so the test sees A
    return m.eval()


def test_param_count_formula_matches_module():
    """KDALayer.param_count (used by `longmoe inspect`) equals the real parameter count."""
    for c in (cfg(), cfg(kda_heads=3, kda_head_dim=16, kda_gate_rank=5, kda_conv_size=2)):
        assert KDALayer.param_count(c) == sum(p.numel() for p in KDALayer(c).parameters())


@pytest.mark.parametrize("split", [1, 3, 5, 16, 17])
def test_chunked_prefill_equals_full(split):
    """Running [0, s) then [s, T) with the carried state + conv tail equals one full call."""
    c = cfg()
    m = layer(c)
    x = torch.randn(2, 29, c.d_model)
    with torch.no_grad():
        full = m(x)
        st = m.new_state(2, x.device, x.dtype)
        parts = [m(x[:, a : a + split], st) for a in range(0, 29, split)]
    assert (torch.cat(parts, 1) - full).abs().max() < TOL


def test_decode_steps_equal_full():
    """Token-by-token decode (kda_step path) reproduces the full forward at every position."""
    c = cfg()
    m = layer(c)
    x = torch.randn(2, 20, c.d_model)
    with torch.no_grad():
        full = m(x)
        st = m.new_state(2, x.device, x.dtype)
        steps = torch.cat([m(x[:, t : t + 1], st) for t in range(20)], 1)
    assert (steps - full).abs().max() < TOL
    assert st.conv.shape == (2, c.kda_conv_size - 1, 3 * c.kda_heads * c.kda_head_dim)


def test_packed_documents_do_not_leak():
    """With cu_seqlens each document's output equals that document run alone (conv + state reset)."""
    c = cfg()
    m = layer(c)
    lens = [7, 1, 12, 5]
    x = torch.randn(1, sum(lens), c.d_model)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist())
    with torch.no_grad():
        packed = m(x, packing=Packing(cu))
        alone = torch.cat([m(x[:, a:b]) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)], 1)
    assert (packed - alone).abs().max() < TOL


def test_conv_is_causal_and_tail_is_last_inputs():
    """The depthwise conv output at t depends only on inputs <= t; the tail is the last W-1 inputs."""
    x = torch.randn(1, 10, 6)
    w = torch.randn(6, 4)
    y, tail = _causal_conv(x, w, None, None)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    y2, _ = _causal_conv(x2, w, None, None)
    assert torch.equal(y[:, :6], y2[:, :6]) and not torch.allclose(y[:, 6:], y2[:, 6:])
    assert torch.equal(tail, x[:, -3:])
    ref = sum(w[:, 3 - s] * torch.nn.functional.pad(x, (0, 0, s, 0))[:, :10] for s in range(4))
    assert (y - ref).abs().max() < 1e-6


def test_conv_of_one_token_equals_the_tap_by_tap_sum():
    """A decode step's conv (one token after a tail: one product and one sum over the taps) equals the
    tap-by-tap form the longer calls take, fed the same inputs one token at a time."""
    x = torch.randn(2, 7, 6)
    w = torch.randn(6, 4)
    y_all, _ = _causal_conv(x, w, None, None)
    tail = None
    for t in range(7):
        y, tail = _causal_conv(x[:, t : t + 1], w, tail, None)
        torch.testing.assert_close(y, y_all[:, t : t + 1], atol=1e-6, rtol=1e-6)


def test_gate_init_is_bounded_and_slow():
    """At init every log-decay lies in the documented range [-0.1, -0.001] (inside (g_min, 0))."""
    c = cfg()
    m = KDALayer(c)
    m.init_weights(0.02, 0.02)
    g = c.g_min * torch.sigmoid(m.gate_up.bias)
    assert (g < -0.999e-3).all() and (g > -0.1001).all()
    c2 = cfg(kda_gate="softplus")
    m2 = KDALayer(c2)
    m2.init_weights(0.02, 0.02)
    g2 = -torch.nn.functional.softplus(m2.gate_up.bias)
    assert (g2 < -0.999e-3).all() and (g2 > -0.1001).all()
