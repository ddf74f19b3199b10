"""Typed, validated training configuration: the context curriculum and the optimisation knobs.

``TrainConfig`` is written to ``RUN_DIR/train_config.json`` and read back on ``--resume`` so a resumed
run uses exactly the settings it started with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longmoe.configio import JsonConfig, check_types, dataclass_from_dict
from longmoe.data.stages import CurriculumStage, tiny_curriculum
from longmoe.train.optim import SCHEDULES
from longmoe.validation import check, is_positive_int


@dataclass
class TrainConfig(JsonConfig):
    """Everything ``longmoe train`` needs besides the model config."""

    stages: list[CurriculumStage] = field(default_factory=tiny_curriculum)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    schedule: str = "cosine"
    wsd_decay_fraction: float = 0.2  # WSD: share of steps in the final decay
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    grad_accum: int = 1
    bf16: bool = False
    compile: bool = False
    seed: int = 0
    log_every: int = 1
    eval_every: int = 50  # optimizer steps between validation passes (0: only at stage ends)
    val_windows: int = 4  # validation windows per evaluation
    ckpt_every: int = 100  # optimizer steps between checkpoints (0: only at the end)
    keep_last: int = 3
    data: str | None = None  # None: embedded standard-library corpus
    # parallel layout under torchrun (dp_shard · ep · cp = processes; None: what ep and cp leave), and
    # activation checkpointing; a resumed run may change them (see train/sharding.py)
    dp_shard: int | None = None
    ep: int = 1
    cp: int = 1
    activation_checkpointing: bool = False
    # fine-tuning guard against routing drift: MoE routers get no updates, the balancing bias stays
    freeze_router: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stages, list):
            self.stages = [
                dataclass_from_dict(CurriculumStage, s, prefix=f"stages[{i}].") if isinstance(s, dict) else s
                for i, s in enumerate(self.stages)
            ]
        self.validate()

    def validate(self) -> None:
        check_types(self)
        check(
            isinstance(self.stages, list) and len(self.stages) > 0,
            "stages",
            self.stages,
            "a non-empty list of curriculum stages",
        )
        for i, s in enumerate(self.stages):
            s.validate(i)
        check(self.lr > 0, "lr", self.lr, "a float > 0")
        check(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        check(self.schedule in SCHEDULES, "schedule", self.schedule, f"one of {SCHEDULES}")
        check(
            0.0 < self.wsd_decay_fraction <= 1.0,
            "wsd_decay_fraction",
            self.wsd_decay_fraction,
            "a float in (0, 1]",
        )
        check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a float >= 0")
        check(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            "beta1/beta2",
            (self.beta1, self.beta2),
            "floats in [0, 1)",
        )
        check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "a float >= 0 (0 disables clipping)")
        for n in ("grad_accum", "log_every", "val_windows", "keep_last"):
            check(is_positive_int(getattr(self, n)), n, getattr(self, n), "a positive integer")
        for n in ("ep", "cp"):
            check(is_positive_int(getattr(self, n)), n, getattr(self, n), "a positive integer")
        check(
            self.dp_shard is None or is_positive_int(self.dp_shard),
            "dp_shard",
            self.dp_shard,
            "null (all processes left by ep · cp) or a positive integer",
        )
        for n in ("warmup_steps", "eval_every", "ckpt_every", "seed"):
            v = getattr(self, n)
            check(isinstance(v, int) and v >= 0, n, v, "a non-negative integer")

    @property
    def total_batches(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def total_steps(self) -> int:
        """Optimizer steps: batches grouped by ``grad_accum`` (a last partial group still steps)."""
        return -(-self.total_batches // self.grad_accum)
