"""Balancers move the bias toward balance; metrics read the load correctly."""

from __future__ import annotations

import math

import torch

from longmoe.config import FFNConfig
from longmoe.layers import balance
from longmoe.layers.moe import MoELayer


def _skewed(E: int) -> torch.Tensor:
    return torch.linspace(1.0, 100.0, E)  # expert i gets load growing with i


def test_quantile_update_moves_overloaded_down_underloaded_up():
    """Experts above the median lose δ, below gain δ, the median itself stays."""
    load = torch.tensor([1.0, 5.0, 9.0, 20.0, 3.0])
    new = balance.quantile_update(torch.zeros(5), load, delta=0.1, q=0.5)
    torch.testing.assert_close(new, torch.tensor([0.1, 0.0, -0.1, -0.1, 0.1]))


def test_quantile_update_with_896_experts_and_other_quantiles():
    """E = 896: exactly the experts above the q-quantile move down, those below move up."""
    load = _skewed(896)[torch.randperm(896, generator=torch.Generator().manual_seed(0))]
    for q in (0.5, 0.9):
        new = balance.quantile_update(torch.zeros(896), load, delta=1e-3, q=q)
        thr = torch.quantile(load, q)
        assert (new[load > thr] == -1e-3).all() and (new[load < thr] == 1e-3).all()
        frac_down = float((new < 0).float().mean())
        assert abs(frac_down - (1 - q)) < 0.01


def test_sign_update_follows_mean_minus_load():
    """bias += δ·sign(mean − load): overloaded down, underloaded up."""
    load = torch.tensor([10.0, 30.0, 20.0])
    new = balance.sign_update(torch.ones(3), load, delta=0.5)
    torch.testing.assert_close(new, torch.tensor([1.5, 0.5, 1.0]))


def test_aux_loss_is_coef_at_balance_and_larger_when_skewed_with_gradient_toward_balance():
    """Uniform scores and uniform counts give exactly coef; a collapsed router scores higher and its gradient
    lowers the score of the overloaded expert."""
    E, N, k = 8, 64, 2
    uni = torch.full((N, E), 0.5)
    idx = torch.arange(N * k).remainder(E).view(N, k)
    assert math.isclose(float(balance.aux_balance_loss(uni, idx, E, 0.01)), 0.01, rel_tol=1e-6)
    logits = torch.zeros(N, E)
    logits[:, 0] = 3.0
    logits.requires_grad_()
    scores = torch.sigmoid(logits)
    collapsed = torch.stack([torch.zeros(N, dtype=torch.long), torch.ones(N, dtype=torch.long)], 1)
    loss = balance.aux_balance_loss(scores, collapsed, E, 0.01)
    assert float(loss) > 0.01
    loss.backward()
    assert (logits.grad[:, 0] > 0).all()  # gradient descent lowers expert 0's score


def test_max_vio_and_entropy_values():
    """MaxVio 0 at balance and E−1 when one expert takes all; entropy log E for a uniform router."""
    assert balance.max_vio(torch.ones(16)) == 0.0
    one = torch.zeros(16)
    one[3] = 10.0
    assert math.isclose(balance.max_vio(one), 15.0, rel_tol=1e-6)
    ent = float(balance.router_entropy(torch.full((4, 16), 0.3)))
    assert math.isclose(ent, balance.max_entropy(16), rel_tol=1e-6)


def _layer(balancer: str, E: int = 32, window: int = 2) -> MoELayer:
    cfg = FFNConfig(
        kind="moe",
        n_experts=E,
        top_k=2,
        n_shared=0,
        expert_hidden=8,
        balancer=balancer,
        bias_step=0.01,
        balance_window=window,
    )
    torch.manual_seed(0)
    layer = MoELayer(16, cfg)
    with torch.no_grad():  # a skewed router: expert 0 is picked by every token
        layer.router.weight[0] += 1.0
    return layer


def _step(layer: MoELayer, x: torch.Tensor) -> None:
    layer.train()
    layer(x)
    layer.update_balance()


def test_layer_balancers_push_bias_against_a_skewed_router():
    """quantile and sign lower the bias of the overloaded expert and raise it for starved ones; aux and none
    leave the bias alone."""
    x = torch.randn(256, 16).abs()  # positive inputs: expert 0 (all-positive offset) dominates
    for name in ("quantile", "sign"):
        layer = _layer(name)
        _step(layer, x)
        load = layer.load
        assert load[0] == load.max()
        assert layer.bias[0] < 0
        assert (layer.bias[load == 0] > 0).all()
    for name in ("aux", "none"):
        layer = _layer(name)
        _step(layer, x)
        assert (layer.bias == 0).all()


def test_quantile_balancing_reduces_max_vio_over_steps():
    """Repeated quantile steps on a fixed skewed router bring MaxVio down (the bias does the balancing)."""
    layer = _layer("quantile", window=1)
    x = torch.randn(512, 16)
    _step(layer, x)
    first = layer.balance_metrics()["max_vio"]
    for _ in range(150):
        _step(layer, x)
    last = layer.balance_metrics()["max_vio"]
    assert last < 0.5 * first, (first, last)


def test_window_counts_metrics_and_state_dict_roundtrip():
    """The window keeps the last `balance_window` steps; metrics report the normalised load and dead
    experts; every piece of balancer state survives a state_dict round trip."""
    layer = _layer("quantile", window=2)
    x = torch.randn(64, 16)
    for _ in range(3):
        _step(layer, x)
    assert float(layer.load.sum()) == 2 * 64 * 2  # two steps in the window, N·k pairs each
    assert float(layer.step_counts.sum()) == 0  # reset after update_balance
    m = layer.balance_metrics()
    assert set(m) == {"max_vio", "dead_experts", "router_entropy", "load"}
    assert math.isclose(sum(m["load"]), 1.0, rel_tol=1e-5) and len(m["load"]) == 32
    assert m["dead_experts"] == int((layer.load == 0).sum())
    assert 0 < m["router_entropy"] <= balance.max_entropy(32) + 1e-6
    sd = layer.state_dict()
    for key in ("bias", "load_window", "window_pos", "step_counts", "balance_steps"):
        assert key in sd
    fresh = _layer("quantile", window=2)
    fresh.load_state_dict(sd)
    for key in ("bias", "load_window", "window_pos"):
        torch.testing.assert_close(getattr(fresh, key), getattr(layer, key))
