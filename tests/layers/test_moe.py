"""The MoE layer: shapes, the dense oracle, bias semantics, accounting at the seeds' expert count."""

from __future__ import annotations

import math

import pytest
import torch

from longmoe.config import FFNConfig
from longmoe.layers.moe import MoELayer
from longmoe.ops.glu import glu_act
from longmoe.ops.moe import dense_reference, route


def _cfg(**kw) -> FFNConfig:
    base = dict(
        kind="moe", n_experts=16, top_k=4, n_shared=1, latent_ratio=2, expert_hidden=8, shared_hidden=12
    )
    base.update(kw)
    return FFNConfig(**base)


def _reference_forward(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """The layer's formula written out with the dense every-expert reference."""
    xf = x.reshape(-1, layer.d_model)
    _, idx, w = route(xf @ layer.router.weight.T, layer.bias, layer.cfg.top_k, layer.cfg.routed_scale)
    z = xf @ layer.down.weight.T if layer.down is not None else xf
    y = dense_reference(z, idx, w, layer.w_in, layer.w_out, layer.cfg.glu)
    y = y @ layer.up.weight.T if layer.up is not None else y
    if layer.shared is not None:
        y = y + glu_act(xf @ layer.shared.w_in.weight.T, layer.cfg.glu) @ layer.shared.w_out.weight.T
    return y.reshape(x.shape)


@pytest.mark.parametrize("latent_ratio, glu, n_shared", [(1, "swiglu", 0), (2, "swiglu", 1), (4, "geglu", 2)])
def test_layer_matches_formula_and_gradients(latent_ratio, glu, n_shared):
    """Layer output and every parameter gradient equal the dense-reference formula (fp32, ≤ 1e-5)."""
    torch.manual_seed(0)
    layer = MoELayer(32, _cfg(latent_ratio=latent_ratio, glu=glu, n_shared=n_shared, routed_scale=1.5))
    x = torch.randn(2, 7, 32, requires_grad=True)
    y = layer(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    ref = _reference_forward(layer, x)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    params = [x] + [p for _, p in layer.named_parameters()]
    ga = torch.autograd.grad(y.square().sum(), params)
    gb = torch.autograd.grad(ref.square().sum(), params)
    for (name, _), a, b in zip([("x", x), *layer.named_parameters()], ga, gb):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=name)


def test_parameter_names_and_shapes_follow_the_contract():
    """router.weight [E, d], down/up only with α > 1, w_in [E, ℓ, 2f], w_out [E, f, ℓ], no biases."""
    layer = MoELayer(64, _cfg(latent_ratio=4))
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert shapes == {
        "router.weight": (16, 64),
        "down.weight": (16, 64),
        "up.weight": (64, 16),
        "w_in": (16, 16, 16),
        "w_out": (16, 8, 16),
        "shared.w_in.weight": (24, 64),
        "shared.w_out.weight": (64, 12),
    }
    assert "down.weight" not in dict(MoELayer(64, _cfg(latent_ratio=1)).named_parameters())


def test_bias_gets_no_gradient_and_never_changes_weights():
    """The bias is a buffer: no grad; shifting it changes the chosen experts but the output for tokens whose
    choice is unchanged is identical."""
    torch.manual_seed(1)
    layer = MoELayer(32, _cfg(n_shared=0))
    assert "bias" in dict(layer.named_buffers()) and "bias" not in dict(layer.named_parameters())
    x = torch.randn(40, 32)
    y0 = layer(x)
    y0.sum().backward()
    assert layer.bias.grad is None and not layer.bias.requires_grad
    _, idx0, w0 = route(x @ layer.router.weight.T, layer.bias, 4)
    with torch.no_grad():
        layer.bias[idx0[0, 0]] -= 10.0  # push token 0's first choice out
    _, idx1, w1 = route(x @ layer.router.weight.T, layer.bias, 4)
    assert idx0[0, 0] not in idx1[0].tolist()
    same = (idx0 == idx1).all(-1)
    assert same.any() and not same.all()
    torch.testing.assert_close(w1[same], w0[same])
    y1 = layer(x)
    torch.testing.assert_close(y1[same], y0[same])
    assert not torch.allclose(y1[~same], y0[~same])


def test_seed_scale_layer_runs_fwd_bwd_and_matches_analytic_count():
    """E = 896, k = 8, one shared expert, α = 4, small d: forward+backward run; parameter count equals
    `analytic_param_counts` (what `longmoe inspect` uses); the active count uses k experts."""
    cfg = FFNConfig(
        kind="moe", n_experts=896, top_k=8, n_shared=1, latent_ratio=4, expert_hidden=16, shared_hidden=32
    )
    layer = MoELayer(64, cfg)
    x = torch.randn(2, 128, 64, requires_grad=True)
    layer.train()
    y = layer(x)
    (y.square().mean() + layer.aux_loss).backward()
    assert torch.isfinite(x.grad).all() and layer.w_in.grad.abs().sum() > 0
    counts = MoELayer.analytic_param_counts(64, cfg)
    assert sum(counts.values()) == sum(p.numel() for p in layer.parameters())
    assert counts == {
        "router": 896 * 64,
        "latent_proj": 2 * 64 * 16,
        "routed_experts": 896 * 3 * 16 * 16,
        "shared_experts": 3 * 64 * 32,
    }
    active = MoELayer.active_param_counts(64, cfg)
    assert active["routed_experts"] == 8 * 3 * 16 * 16 and active["router"] == counts["router"]
    assert float(layer.step_counts.sum()) == 2 * 128 * 8


def test_aux_loss_only_for_aux_balancer_and_in_training():
    """aux_loss is a positive differentiable scalar with balancer='aux' in training, 0 otherwise."""
    x = torch.randn(30, 32)
    layer = MoELayer(32, _cfg(balancer="aux", aux_loss_coef=0.1)).train()
    layer(x)
    assert layer.aux_loss.dim() == 0 and float(layer.aux_loss.detach()) > 0 and layer.aux_loss.requires_grad
    layer.eval()
    layer(x)
    assert float(layer.aux_loss) == 0
    q = MoELayer(32, _cfg(balancer="quantile")).train()
    q(x)
    assert float(q.aux_loss) == 0


def test_eval_forward_does_not_touch_balancer_state():
    """Inference (eval mode) leaves the step counts alone, so serving never perturbs balancing."""
    layer = MoELayer(32, _cfg()).eval()
    with torch.no_grad():
        layer(torch.randn(10, 32))
    assert float(layer.step_counts.sum()) == 0


def test_bf16_forward_keeps_dtype():
    """bf16 inputs and weights give a bf16 output of the same shape, close to the fp32 layer."""
    torch.manual_seed(2)
    layer = MoELayer(32, _cfg())
    x = torch.randn(3, 5, 32)
    y32 = layer(x)
    yb = layer.to(torch.bfloat16)(x.bfloat16())
    assert yb.dtype == torch.bfloat16 and yb.shape == x.shape
    assert (yb.float() - y32).abs().max() < 0.05 * y32.abs().max() + 1e-3


def test_balancer_state_survives_model_save_and_load(tmp_path):
    """Bias, load window, ring position and step counters go into the model checkpoint and come back."""
    from longmoe.config import ModelConfig
    from longmoe.model import LongMoE

    ffn = _cfg(n_experts=8, top_k=2, first_k_dense=0)
    cfg = ModelConfig(
        vocab_size=64, d_model=32, n_layers=2, layer_pattern="LM", kda_heads=2, kda_head_dim=16,
        kda_gate_rank=4, mla_heads=2, mla_q_lora_rank=16, mla_kv_lora_rank=8, mla_head_dim=16,
        mla_v_head_dim=16, attn_res_blocks=2, ffn=ffn,
    )  # fmt: skip
    torch.manual_seed(3)
    model = LongMoE(cfg).train()
    for _ in range(3):
        model(torch.randint(0, 64, (1, 24)))
        for m in model.moe_layers():
            m.update_balance()
    moe = model.moe_layers()
    assert len(moe) == 2 and all(float(m.bias.abs().sum()) > 0 for m in moe)
    loaded = LongMoE.from_pretrained(model.save_pretrained(tmp_path / "ckpt"))
    for a, b in zip(moe, loaded.moe_layers()):
        for key in ("bias", "load_window", "window_pos", "balance_steps", "last_entropy"):
            torch.testing.assert_close(getattr(b, key), getattr(a, key), msg=key)
        assert b.balance_metrics() == a.balance_metrics()


def test_router_entropy_metric_is_a_strided_estimate_over_many_tokens():
    """Above ENTROPY_TOKENS tokens the logged entropy is the exact entropy of an evenly strided sample."""
    from longmoe.layers import balance
    from longmoe.layers.moe import ENTROPY_TOKENS

    torch.manual_seed(0)
    layer = MoELayer(32, _cfg())
    x = torch.randn(3 * ENTROPY_TOKENS + 5, 32)
    layer(x)
    scores = torch.sigmoid(x @ layer.router.weight.T)
    exact = float(balance.router_entropy(scores))
    sampled = float(balance.router_entropy(scores[::4]))  # ceil((3·512 + 5) / 512) = 4
    logged = float(layer.step_entropy[0] / layer.step_entropy[1])
    assert math.isclose(logged, sampled, rel_tol=1e-5)
    assert abs(logged - exact) < 0.01 * exact


def test_router_stays_fp32_under_autocast():
    """Under bf16 autocast the routing is the fp32 routing (bf16-rounded logits would flip choices)."""
    torch.manual_seed(3)
    layer = MoELayer(64, _cfg(n_experts=64, top_k=4))
    x = torch.randn(512, 64)
    layer(x)
    fp32_counts = layer.step_counts.clone()
    layer.step_counts.zero_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
    assert torch.equal(layer.step_counts, fp32_counts)
