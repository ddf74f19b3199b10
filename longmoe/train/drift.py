"""Routing drift: how a fine-tuned MoE's expert choices move away from a reference model's.

The seeds name routing drift as the MoE fine-tuning hazard: a few hundred steps of SFT or RL can
reshuffle which experts tokens reach, so knowledge stored in experts stops being used. Two numbers
per MoE layer, measured on the same tokens fed to both models:

- ``changed``: the share of top-k choices not in the reference's top-k set for that token
  (``1 - |S_cur ∩ S_ref| / k``, averaged over tokens): 0 for identical routing, 1 for disjoint;
- ``load_tv``: the total variation distance between the two load histograms (share of routed
  (token, expert) pairs per expert): ``½ Σ_e |p_e - q_e|``, in [0, 1].

``routing_choices`` records a model's choices (hooks on each MoE layer replay its router: the same
``ops.moe.route`` call on the same input, so the ids are exactly the layer's). A trainer records the
reference's choices once on a fixed probe batch and compares with the current model's every few steps.

``freeze_routing`` is the guard: router weights stop receiving gradients (and leave the optimizer)
and the balancer stops moving the selection bias (its load statistics keep being recorded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from longmoe.layers.moe import MoELayer
from longmoe.model import LongMoE
from longmoe.ops.moe.route import route


def layer_choices(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """The top-k expert ids ``layer`` picks for input ``x [..., d]``: ``[N, k]`` (as its forward does)."""
    cfg = layer.cfg
    logits = F.linear(x.reshape(-1, layer.d_model).float(), layer.router.weight.float())  # [N, E]
    _, idx, _ = route(logits, layer.bias, cfg.top_k, cfg.routed_scale, cfg.n_group, cfg.topk_group)
    return idx


@torch.no_grad()
def routing_choices(
    model: LongMoE, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Per MoE layer, the top-k expert ids for every token of ``input_ids [B, T]`` (packed segments
    with ``cu_seqlens``): a list of ``[B·T, k]`` long tensors, on the CPU. Runs one eval-mode forward."""
    layers = model.moe_layers()
    out: list[torch.Tensor] = []
    hooks = [
        m.register_forward_hook(lambda m, inp, _: out.append(layer_choices(m, inp[0]).cpu())) for m in layers
    ]
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    cu = cu_seqlens
    try:
        model(input_ids.to(dev), cu_seqlens=None if cu is None else cu.to(dev))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return out


def load_histogram(idx: torch.Tensor, n_experts: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Share of the (token, expert) pairs in ``idx [N, k]`` per expert (``weights [N]``: per-token weight)."""
    w = torch.ones(idx.shape[0]) if weights is None else weights.float()
    counts = torch.zeros(n_experts).index_add_(0, idx.reshape(-1).cpu(), w.repeat_interleave(idx.shape[1]))
    total = counts.sum()
    return counts / total if total > 0 else counts


def changed_share(current: torch.Tensor, reference: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Per token, the share of ``current``'s top-k choices not among ``reference``'s: ``[N]`` in [0, 1]."""
    if current.shape != reference.shape:
        raise ValueError(f"routing shapes differ: {tuple(current.shape)} vs {tuple(reference.shape)}")
    n, k = current.shape
    a = torch.zeros(n, n_experts).scatter_(1, current.cpu(), 1.0)
    b = torch.zeros(n, n_experts).scatter_(1, reference.cpu(), 1.0)
    return 1.0 - (a * b).sum(1) / k


@dataclass
class RoutingDrift:
    """Drift per MoE layer (lists indexed by MoE layer, in model order)."""

    changed: list[float]
    load_tv: list[float]

    def record(self) -> dict[str, Any]:
        """Fields for ``metrics.jsonl``: per-layer lists and their means."""
        mean = lambda xs: sum(xs) / len(xs) if xs else 0.0
        return {
            "drift_changed": [round(x, 5) for x in self.changed],
            "drift_load_tv": [round(x, 5) for x in self.load_tv],
            "drift_changed_mean": round(mean(self.changed), 5),
            "drift_load_tv_mean": round(mean(self.load_tv), 5),
        }


def routing_drift(
    current: list[torch.Tensor],
    reference: list[torch.Tensor],
    n_experts: int,
    token_mask: torch.Tensor | None = None,
) -> RoutingDrift:
    """Compare per-layer choices (``routing_choices`` of two models on the same tokens); ``token_mask
    [N]`` (bool) keeps only some tokens (e.g. the policy's own tokens in RL)."""
    if len(current) != len(reference):
        raise ValueError(f"MoE layer counts differ: {len(current)} vs {len(reference)}")
    changed, tv = [], []
    for cur, ref in zip(current, reference):
        w = None if token_mask is None else token_mask.reshape(-1).float().cpu()
        per_token = changed_share(cur, ref, n_experts)
        denom = per_token.numel() if w is None else float(w.sum())
        changed.append(float((per_token if w is None else per_token * w).sum()) / max(denom, 1.0))
        p, q = load_histogram(cur, n_experts, w), load_histogram(ref, n_experts, w)
        tv.append(0.5 * float((p - q).abs().sum()))
    return RoutingDrift(changed, tv)


def measure_drift(
    model: LongMoE, reference: LongMoE, input_ids: torch.Tensor, token_mask: torch.Tensor | None = None
) -> RoutingDrift:
    """Routing drift of ``model`` from ``reference`` on ``input_ids [B, T]`` (both forwards in eval mode)."""
    n_experts = model.cfg.ffn.n_experts
    return routing_drift(
        routing_choices(model, input_ids), routing_choices(reference, input_ids), n_experts, token_mask
    )


def freeze_routing(model: LongMoE) -> None:
    """Freeze every MoE router and its balancing bias (call before the optimizer is built)."""
    for m in model.moe_layers():
        m.router.weight.requires_grad_(False)
        m.freeze_bias = True
