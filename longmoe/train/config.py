"""Typed, validated training configuration: the context curriculum and the optimisation knobs.

``TrainConfig`` is written to ``RUN_DIR/train_config.json`` and read back on ``--resume`` so a resumed
run uses exactly the settings it started with.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longmoe.config import ConfigError, _check
from longmoe.data.mix import SYNTHETIC_LOSS, valid_length_range

SCHEDULES = ("cosine", "wsd", "constant")


def _pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


@dataclass
class CurriculumStage:
    """One curriculum stage: window length, token budget, data mix, and short-window replay.

    Each batch holds ``batch_size`` windows of ``window`` tokens from ``mix``; with ``replay_fraction``
    r > 0 it also holds short windows of ``replay_window`` tokens from ``replay_mix`` making up a share
    r of the batch's tokens, so long and short sequences are mixed within every batch.
    """

    name: str
    window: int
    tokens: int  # token budget of the stage (long + replay tokens); steps = ceil(tokens / batch tokens)
    batch_size: int = 1
    mix: dict[str, float] = field(default_factory=lambda: {"file": 1.0})
    replay_fraction: float = 0.0
    replay_window: int = 256
    replay_mix: dict[str, float] = field(default_factory=lambda: {"file": 1.0})
    synthetic_loss: str = "all"  # "answer": task documents train on their answers only (SFT-style)
    # task documents are window x U[lo, hi] tokens; None = SyntheticSource's default (0.4, 0.9)
    synthetic_length: list[float] | None = None

    def validate(self, i: int = 0) -> None:
        p = f"stages[{i}]"
        _check(isinstance(self.name, str) and bool(self.name), f"{p}.name", self.name, "a non-empty string")
        for n in ("window", "tokens", "batch_size", "replay_window"):
            _check(_pos_int(getattr(self, n)), f"{p}.{n}", getattr(self, n), "a positive integer")
        _check(
            0.0 <= self.replay_fraction < 1.0,
            f"{p}.replay_fraction",
            self.replay_fraction,
            "a float in [0, 1)",
        )
        for n in ("mix", "replay_mix"):
            m = getattr(self, n)
            _check(
                isinstance(m, dict)
                and m
                and all(isinstance(w, (int, float)) and w >= 0 for w in m.values())
                and sum(m.values()) > 0,
                f"{p}.{n}",
                m,
                "a non-empty dict source -> non-negative weight with a positive sum",
            )
        _check(
            self.synthetic_loss in SYNTHETIC_LOSS,
            f"{p}.synthetic_loss",
            self.synthetic_loss,
            f"one of {SYNTHETIC_LOSS}",
        )
        _check(
            self.synthetic_length is None or valid_length_range(self.synthetic_length),
            f"{p}.synthetic_length",
            self.synthetic_length,
            "null or [lo, hi] with 0 < lo <= hi < 1 (fractions of the window)",
        )
        if self.replay_fraction > 0:
            _check(
                self.replay_window <= self.window,
                f"{p}.replay_window",
                self.replay_window,
                f"an integer <= window={self.window}",
            )

    @property
    def n_replay(self) -> int:
        """Short windows per batch so that they make up ``replay_fraction`` of the batch's tokens."""
        if self.replay_fraction <= 0:
            return 0
        r = self.replay_fraction
        return max(1, round(r / (1 - r) * self.batch_size * self.window / self.replay_window))

    @property
    def batch_tokens(self) -> int:
        return self.batch_size * self.window + self.n_replay * self.replay_window

    @property
    def steps(self) -> int:
        """Batches (micro-batches) in this stage."""
        return -(-self.tokens // self.batch_tokens)


def tiny_curriculum(scale: float = 1.0, synthetic: bool = True) -> list[CurriculumStage]:
    """The flagship 8K→64K→256K schedule scaled down: 256 → 1K → 4K tokens, with replay of short windows."""
    long_mix = {"package": 0.75, "synthetic": 0.25} if synthetic else {"package": 1.0}
    t = lambda n: max(1, int(n * scale))
    return [
        CurriculumStage("s1-256", window=256, tokens=t(400_000), batch_size=8, mix={"file": 1.0}),
        CurriculumStage(
            "s2-1k",
            window=1024,
            tokens=t(160_000),
            batch_size=2,
            mix=long_mix,
            replay_fraction=0.25,
            replay_window=256,
        ),
        CurriculumStage(
            "s3-4k",
            window=4096,
            tokens=t(100_000),
            batch_size=1,
            mix=long_mix,
            replay_fraction=0.25,
            replay_window=256,
        ),
    ]


def flagship_curriculum() -> list[CurriculumStage]:
    """The seeds' schedule: 8K → 64K → 256K → 1M (budgets illustrative; 1 window per device batch)."""
    long_mix = {"package": 0.7, "synthetic": 0.3}
    return [
        CurriculumStage("8k", window=8192, tokens=int(1e12), batch_size=512, mix={"file": 1.0}),
        CurriculumStage(
            "64k",
            window=65536,
            tokens=int(2e11),
            batch_size=64,
            mix=long_mix,
            replay_fraction=0.2,
            replay_window=8192,
        ),
        CurriculumStage(
            "256k",
            window=262144,
            tokens=int(5e10),
            batch_size=16,
            mix=long_mix,
            replay_fraction=0.2,
            replay_window=8192,
        ),
        CurriculumStage(
            "1m",
            window=1 << 20,
            tokens=int(2e10),
            batch_size=4,
            mix=long_mix,
            replay_fraction=0.2,
            replay_window=8192,
        ),
    ]


@dataclass
class TrainConfig:
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

    def __post_init__(self) -> None:
        self.stages = [s if isinstance(s, CurriculumStage) else CurriculumStage(**s) for s in self.stages]
        self.validate()

    def validate(self) -> None:
        _check(
            isinstance(self.stages, list) and len(self.stages) > 0,
            "stages",
            self.stages,
            "a non-empty list of curriculum stages",
        )
        for i, s in enumerate(self.stages):
            s.validate(i)
        _check(self.lr > 0, "lr", self.lr, "a float > 0")
        _check(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", self.min_lr_ratio, "a float in [0, 1]")
        _check(self.schedule in SCHEDULES, "schedule", self.schedule, f"one of {SCHEDULES}")
        _check(
            0.0 < self.wsd_decay_fraction <= 1.0,
            "wsd_decay_fraction",
            self.wsd_decay_fraction,
            "a float in (0, 1]",
        )
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "a float >= 0")
        _check(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            "beta1/beta2",
            (self.beta1, self.beta2),
            "floats in [0, 1)",
        )
        _check(self.grad_clip >= 0, "grad_clip", self.grad_clip, "a float >= 0 (0 disables clipping)")
        for n in ("grad_accum", "log_every", "val_windows", "keep_last"):
            _check(_pos_int(getattr(self, n)), n, getattr(self, n), "a positive integer")
        for n in ("warmup_steps", "eval_every", "ckpt_every", "seed"):
            v = getattr(self, n)
            _check(isinstance(v, int) and v >= 0, n, v, "a non-negative integer")

    @property
    def total_batches(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def total_steps(self) -> int:
        """Optimizer steps: batches grouped by ``grad_accum`` (a last partial group still steps)."""
        return -(-self.total_batches // self.grad_accum)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown train config field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
