"""The optimizer pieces every trainer shares: AdamW parameter groups (what decays) and the learning-rate
schedule (linear warmup, then cosine / WSD / constant)."""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from longmoe.train.config import TrainConfig

NO_DECAY_KEYS = ("norm", "gate_up", "attn_res")  # norms, the decay-gate projection, AttnRes queries


def lr_at(step: int, cfg: TrainConfig, total: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine / WSD / constant."""
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return peak
    span = max(1, total - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)  # progress after warmup, in [0, 1]
    if cfg.schedule == "cosine":
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * t))
    # WSD: warmup, stable at the peak, then a linear decay over the last ``wsd_decay_fraction``
    start = 1.0 - cfg.wsd_decay_fraction
    return peak if t <= start else peak - (peak - floor) * (t - start) / cfg.wsd_decay_fraction


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: matrices decay; norms, biases, decay-gate parameters and AttnRes queries do not."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        skip = p.dim() < 2 or name.endswith(".A") or any(k in name for k in NO_DECAY_KEYS)
        (no_decay if skip else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
