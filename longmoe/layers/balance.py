"""Expert-load balancers and balance metrics (docs/design.md §1.5), as functions over the layer's buffers.

Three interchangeable balancers; the first two are aux-loss-free (they move a selection bias after each
optimizer step and never touch the gradient), the third is the classic auxiliary loss:

- ``quantile`` (the seeds' method): ``q = quantile(load, p)``; ``bias[load > q] -= δ``,
  ``bias[load < q] += δ``. Only experts on the wrong side of the quantile move, and by a fixed step.
- ``sign`` (DeepSeek-V3 loss-free): ``bias += δ · sign(mean(load) − load)``.
- ``aux``: ``coef · E · Σ_i f_i P_i`` with ``f_i`` the share of routed pairs sent to expert ``i`` and
  ``P_i`` its mean normalised router score; equals ``coef`` at perfect balance.
- ``none``: routing as the router learns it (the ablation baseline).

``load`` is the windowed running load: the per-expert token counts summed over the last
``balance_window`` optimizer steps (a ring buffer of step counts, kept as persistent buffers of the layer).
"""

from __future__ import annotations

import math

import torch

BALANCERS = ("quantile", "sign", "aux", "none")


def quantile_update(bias: torch.Tensor, load: torch.Tensor, delta: float, q: float = 0.5) -> torch.Tensor:
    """New bias after one quantile step: experts above the ``q``-quantile of ``load`` lose δ, below gain."""
    # bias, load: [E]
    thr = torch.quantile(load.float(), q)
    step = (load < thr).to(bias.dtype) - (load > thr).to(bias.dtype)
    return bias + delta * step


def sign_update(bias: torch.Tensor, load: torch.Tensor, delta: float) -> torch.Tensor:
    """New bias after one DeepSeek-V3 loss-free step: ``bias + δ · sign(mean(load) − load)``."""
    load = load.float()
    return bias + delta * torch.sign(load.mean() - load).to(bias.dtype)


def aux_balance_loss(scores: torch.Tensor, idx: torch.Tensor, n_experts: int, coef: float) -> torch.Tensor:
    """Classic load-balancing loss ``coef · E · Σ_i f_i P_i`` (gradient flows through ``P``, not ``f``)."""
    # scores [N, E] (sigmoid, fp32), idx [N, k]
    N, k = idx.shape
    counts = torch.bincount(idx.reshape(-1), minlength=n_experts).to(scores.dtype)
    f = counts / (N * k)  # [E] share of routed pairs
    p = (scores / scores.sum(-1, keepdim=True)).mean(0)  # [E] mean normalised score
    return coef * n_experts * (f * p).sum()


def max_vio(load: torch.Tensor) -> float:
    """``(max load − mean load) / mean load``: 0 when perfectly balanced, E−1 when one expert takes all."""
    load = load.float()
    mean = load.mean()
    if float(mean) <= 0:
        return 0.0
    return float((load.max() - mean) / mean)


def router_entropy(scores: torch.Tensor) -> torch.Tensor:
    """Mean per-token entropy (nats) of the router scores normalised to a distribution over experts."""
    # scores [N, E] -> scalar
    p = scores / scores.sum(-1, keepdim=True)
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1).mean()


def max_entropy(n_experts: int) -> float:
    """Entropy of the uniform router, ``log E`` (to read ``router_entropy`` against)."""
    return math.log(n_experts)
