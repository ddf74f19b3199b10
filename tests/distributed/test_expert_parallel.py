"""Expert parallel over 2 gloo ranks equals the local MoE layer: outputs, gradients, payload width, bias."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from longmoe.config import FFNConfig
from longmoe.distributed.expert_parallel import apply_expert_parallel
from longmoe.layers.moe import MoELayer
from tests.helpers.launch import run_ranks

D = 32
TOKENS = 13  # per rank, odd so the per-expert counts differ across ranks


def _layer(latent_ratio: int, skew: bool = False) -> MoELayer:
    torch.manual_seed(0)  # the same full layer on every rank
    cfg = FFNConfig(
        kind="moe",
        n_experts=8,
        top_k=3,
        n_shared=1,
        latent_ratio=latent_ratio,
        expert_hidden=8,
        shared_hidden=12,
        balancer="quantile",
        bias_step=0.01,
    )
    layer = MoELayer(D, cfg)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(8) * 0.1)  # a non-trivial selection bias
        if skew:  # every pair to experts 0-3: the second rank receives no rows at all
            layer.bias[:4] += 10.0
    return layer


def _inputs(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(world, TOKENS, D, generator=g)  # rank r sees x[r]
    probe = torch.randn(world, TOKENS, D, generator=g)  # loss = Σ y · probe
    return x, probe


def _ep_matches_local(rank: int, world: int, latent_ratio: int, impl: str, skew: bool) -> None:
    ref = _layer(latent_ratio, skew)
    ref.impl = impl
    x, probe = _inputs(world)
    xr = x.clone().requires_grad_(True)
    y_ref = ref(xr.view(1, -1, D)).view_as(x)  # one process: every rank's tokens
    (y_ref * probe).sum().backward()

    ep = _layer(latent_ratio, skew)
    ep.impl = impl
    apply_expert_parallel(ep, init_device_mesh("cpu", (world,)))
    assert isinstance(ep.w_in, DTensor) and ep.w_in.to_local().shape[0] == 8 // world
    xe = x[rank].clone().requires_grad_(True)
    y = ep(xe)
    (y * probe[rank]).sum().backward()
    torch.testing.assert_close(y, y_ref[rank].detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xe.grad, xr.grad[rank], atol=1e-5, rtol=1e-5)

    with pytest.raises(ValueError, match="divisible by the ep degree"):
        apply_expert_parallel(MoELayer(D, FFNConfig(kind="moe", n_experts=5, top_k=2)), ep.w_in.device_mesh)
    with pytest.raises(ValueError, match="already applied"):
        apply_expert_parallel(ep, ep.w_in.device_mesh)

    # the latent payload: ℓ = d/α columns, one row per (token, slot) pair this rank routed
    assert ep.expert_dispatch.last_payload == (TOKENS * 3, D // latent_ratio)
    n = 8 // world
    if skew and rank == 1:  # nothing was routed to this rank's experts
        assert not ep.w_in.grad.to_local().any() and not ep.w_out.grad.to_local().any()
    for name, p in ep.named_parameters():
        g = p.grad
        if isinstance(g, DTensor):  # experts: the owner's gradient, the mean over the ranks' tokens
            g = g.to_local() * world
            want = ref.get_parameter(name).grad[rank * n : (rank + 1) * n]
        else:  # replicated (router, projections, shared): data-parallel sum over ranks
            dist.all_reduce(g)
            want = ref.get_parameter(name).grad
        torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-5, msg=name)

    # balancer: each rank counted its own tokens by global expert id; summed over ranks (what the
    # trainer's distributed.reduce.sync_balance_stats does) they are the one-process counts, and both
    # ranks then move the bias identically
    counts = [torch.empty_like(ep.step_counts) for _ in range(world)]
    dist.all_gather(counts, ep.step_counts)
    torch.testing.assert_close(sum(counts), ref.step_counts, atol=0, rtol=0)
    for buf in (ep.step_counts, ep.step_entropy):
        dist.all_reduce(buf)
    ep.update_balance()
    ref.update_balance()
    torch.testing.assert_close(ep.bias, ref.bias, atol=0, rtol=0)
    torch.testing.assert_close(ep.load_window, ref.load_window, atol=0, rtol=0)
    biases = [torch.empty_like(ep.bias) for _ in range(world)]
    dist.all_gather(biases, ep.bias)
    assert torch.equal(biases[0], biases[1])
    assert not torch.equal(ep.bias, _layer(latent_ratio, skew).bias)  # the update did move it


def test_ep_forward_gradients_payload_and_bias_equal_local():
    """2 ranks, 4 experts each, α = 4: outputs, input/expert/replicated gradients equal the one-process
    layer on both ranks' tokens; the all-to-all payload is [pairs, d/4]; the bias after an update is the
    one-process bias on every rank."""
    run_ranks(_ep_matches_local, 4, "bmm", False)


def test_ep_without_latent_space_grouped_mm_and_an_idle_rank():
    """α = 1 (payload d wide), the grouped_mm expert implementation, and a bias that sends every pair to
    the first rank's experts (the second receives no rows, its experts get zero gradients): the same
    equalities."""
    run_ranks(_ep_matches_local, 1, "grouped_mm", True)
