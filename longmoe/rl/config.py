"""``RLConfig``: every choice of the RL recipe as a typed, validated field (so each can be ablated).

Written to ``RUN/rl_config.json`` and read back on ``--resume``, so a resumed run keeps its settings.
The rollout engine's options are an embedded ``EngineConfig`` (``engine``); a run directory written
before that, with ``max_batch`` / ``prefill_chunk`` at the top level, still loads (they move into it), and
one written before ``tis_cap`` loads with it off (the update rule it ran with).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longmoe.configio import JsonConfig, check_types, load_json
from longmoe.rl.loss import NORMS
from longmoe.serve.engine_config import EngineConfig
from longmoe.validation import check, is_positive_int

RL_CONFIG = "rl_config.json"  # RUN/rl_config.json
REFERENCE_DIR = "reference"  # RUN/reference: the frozen reference model (the starting weights)
# engine fields an RLConfig held at its top level before it embedded an EngineConfig
LEGACY_ENGINE_FIELDS = ("max_batch", "prefill_chunk")


def rl_engine_config(**changes: Any) -> EngineConfig:
    """The rollout engine's defaults: many episodes decoding at once, a 4 GiB cache budget, a queue
    that never refuses a group (``max_context`` None: the trainer sets it from ``max_episode_tokens``)."""
    return EngineConfig(**{"max_batch": 64, "cache_budget_bytes": 4 << 30, "max_waiting": 1 << 16, **changes})


@dataclass
class RLConfig(JsonConfig):
    """``longmoe rl``'s settings; the field comments are the CLI's help."""

    init: str = ""  # model directory or run to start from (e.g. the SFT run); also the KL reference
    env: str = "calculator"  # environment name (longmoe.envs.ENVS)
    horizons: list[int] = field(default_factory=lambda: [2])  # task horizons, cycled over a step's tasks
    env_args: dict[str, Any] = field(default_factory=dict)  # other environment config fields
    steps: int = 40  # RL steps (each: rollouts, then the policy update)
    tasks_per_step: int = 8  # tasks per step; each gets a group of group_size rollouts
    group_size: int = 8  # rollouts per task (G)
    max_turn_tokens: int = 48  # tokens an assistant turn may generate
    max_episode_tokens: int = 1024  # a trajectory's token limit (longer: truncated, reward 0)
    temperature: float = 1.0  # rollout sampling temperature
    lr: float = 5e-5  # AdamW learning rate (constant)
    weight_decay: float = 0.0  # AdamW weight decay on matrices
    grad_clip: float = 1.0  # 0 disables clipping
    ppo_epochs: int = 1  # passes over a step's rollouts
    minibatches: int = 1  # optimizer steps per pass
    micro_batch: int = 8  # trajectories per forward (gradient accumulation; the loss is unchanged)
    clip_low: float = 0.2  # PPO: ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.28  # (asymmetric: a higher ceiling keeps rare good tokens rising, as DAPO)
    # TIS: the engine's arithmetic differs from the trainer's in the last bits (docs/agent.md), so the
    # ratio is taken against the trainer's recompute and each token's pg term weighted (None: off)
    tis_cap: float | None = 2.0  # truncated importance weight cap C: min(π_trainer/π_rollout, C); none: off
    kl_coef: float = 0.02  # weight of the k3 KL to the frozen reference (0: no KL term)
    step_adv_weight: float = 1.0  # ω: weight of the step-wise (GiGPO) advantage (0: episode only)
    gamma: float = 0.95  # discount of the terminal reward over turns (step-wise returns)
    adv_std_norm: bool = True  # divide group-relative advantages by the group's std
    loss_norm: str = "token"  # "token": mean over all policy tokens; "sequence": per trajectory first
    freeze_router: bool = False  # MoE routers and balancing bias frozen (routing-drift guard)
    drift_every: int = 1  # steps between routing-drift measurements (0: never)
    drift_trajectories: int = 4  # trajectories of the step's rollouts the drift is measured on
    seed: int = 0  # task seeds and sampling seeds derive from it and the step
    ckpt_every: int = 10  # steps between checkpoints (0: only at the end)
    keep_last: int = 2  # complete checkpoints kept
    engine: EngineConfig = field(default_factory=rl_engine_config)  # the rollout engine's options

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str | None = None) -> RLConfig:
        """From parsed JSON: ``engine`` fields not given keep the RL defaults (``rl_engine_config``), and
        the top-level ``max_batch`` / ``prefill_chunk`` of an older ``rl_config.json`` move into it."""
        if isinstance(d, dict):
            d = dict(d)
            engine = d.get("engine", {})
            moved = {k: d.pop(k) for k in LEGACY_ENGINE_FIELDS if k in d}
            if isinstance(engine, dict):
                d["engine"] = {**dataclasses.asdict(rl_engine_config()), **moved, **engine}
        return super().from_dict(d, where)  # type: ignore[misc]

    @classmethod
    def load(cls, path: str | Path) -> RLConfig:
        """A run's ``rl_config.json``: one written before ``tis_cap`` existed keeps its update rule (off)."""
        d = load_json(path)
        if isinstance(d, dict) and "tis_cap" not in d:
            d = {**d, "tis_cap": None}
        return cls.from_dict(d, where=str(path))

    def engine_config(self) -> EngineConfig:
        """The engine the rollouts run on: ``engine`` with ``max_context`` (unless set) fitting an episode."""
        if self.engine.max_context is not None:
            return self.engine
        return dataclasses.replace(self.engine, max_context=max(self.max_episode_tokens + 1, 2))

    def __post_init__(self) -> None:
        check_types(self)
        for f in ("steps", "tasks_per_step", "group_size", "max_turn_tokens", "max_episode_tokens"):
            check(is_positive_int(getattr(self, f)), f, getattr(self, f), "a positive integer")
        for f in ("ppo_epochs", "minibatches", "micro_batch", "keep_last"):
            check(is_positive_int(getattr(self, f)), f, getattr(self, f), "a positive integer")
        for f in ("ckpt_every", "drift_every", "drift_trajectories"):
            check(getattr(self, f) >= 0, f, getattr(self, f), "an integer >= 0")
        check(bool(self.horizons) and all(is_positive_int(h) for h in self.horizons), "horizons",
               self.horizons, "a non-empty list of positive integers")  # fmt: skip
        check(0 < self.lr < 1, "lr", self.lr, "a number in (0, 1)")
        check(0 <= self.clip_low < 1 and self.clip_high >= 0, "clip_low/clip_high",
               (self.clip_low, self.clip_high), "clip_low in [0, 1) and clip_high >= 0")  # fmt: skip
        cap = self.tis_cap
        check(cap is None or cap >= 1, "tis_cap", cap, "None (off) or a number >= 1")
        check(self.kl_coef >= 0, "kl_coef", self.kl_coef, "a number >= 0")
        check(self.step_adv_weight >= 0, "step_adv_weight", self.step_adv_weight, "a number >= 0")
        check(0 < self.gamma <= 1, "gamma", self.gamma, "a number in (0, 1]")
        check(0 < self.temperature <= 10, "temperature", self.temperature, "a number in (0, 10]")
        check(self.loss_norm in NORMS, "loss_norm", self.loss_norm, f"one of {NORMS}")
        check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "a number >= 0")
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a number >= 0")
