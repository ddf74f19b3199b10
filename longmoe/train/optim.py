"""The one optimizer + schedule factory every training loop uses: AdamW over parameter groups (what
decays) and the learning-rate schedule (linear warmup, then cosine / WSD / constant) as a part that
saves and loads its own position.

``build_optimizer`` is the package's only ``AdamW`` construction (a test greps for it), so a new loop
cannot drift from the pretraining groups, betas or epsilon without saying so in its arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

NO_DECAY_KEYS = ("norm", "gate_up", "attn_res")  # norms, the decay-gate projection, AttnRes queries
SCHEDULES = ("cosine", "wsd", "constant")


class ScheduleSettings(Protocol):
    """What ``lr_at`` reads (``TrainConfig`` and ``ScheduleConfig`` both have it)."""

    lr: float
    min_lr_ratio: float
    warmup_steps: int
    schedule: str
    wsd_decay_fraction: float


@dataclass(frozen=True)
class ScheduleConfig:
    """A learning-rate schedule on its own (for loops without a ``TrainConfig``: recipes, RL)."""

    lr: float
    warmup_steps: int = 0
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    wsd_decay_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"schedule.lr={self.lr!r} is invalid: expected a float > 0")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule.schedule={self.schedule!r} is invalid: expected one of {SCHEDULES}")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"schedule.warmup_steps={self.warmup_steps!r}: expected an integer >= 0")


def lr_at(step: int, cfg: ScheduleSettings, total: int) -> float:
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


def build_optimizer(
    model: nn.Module,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters in ``param_groups`` (frozen ones are left out, so
    freeze before building). The package's one optimizer construction."""
    return torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)


class LRSchedule:
    """The learning rate of each optimizer step, written into the optimizer's groups by ``apply()``.

    A checkpoint part: its state is the number of steps taken (``advance()``), so a resumed run sets
    the same learning rate as one that never stopped; ``total`` is part of the state only to be checked
    (a run resumed with another step budget would silently bend its schedule)."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: ScheduleSettings, total: int) -> None:
        self.opt, self.cfg, self.total, self.step = optimizer, cfg, int(total), 0

    @property
    def lr(self) -> float:
        return lr_at(self.step, self.cfg, self.total)

    def apply(self) -> float:
        """Set the current step's learning rate on every group; returns it."""
        lr = self.lr
        for g in self.opt.param_groups:
            g["lr"] = lr
        return lr

    def advance(self) -> None:
        self.step += 1

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "total": self.total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """``total`` is absent in a format-1 checkpoint (upgraded from its step): nothing to check."""
        if state.get("total", self.total) != self.total:
            raise ValueError(
                f"the checkpoint's schedule spans {int(state['total'])} steps, this run {self.total}: "
                "a resumed run keeps its step budget"
            )
        self.step = int(state["step"])
