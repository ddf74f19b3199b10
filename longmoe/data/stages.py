"""Curriculum stages: the typed, validated description of one stage of the context curriculum
(window, token budget, data mix, short-window replay), and the default tiny schedule.

A stage is data's concept, a plain description (``longmoe.train.curriculum.Curriculum`` turns a list
of them into packed batches); ``TrainConfig.stages`` holds them and ``train_config.json`` stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from longmoe.configio import check_types
from longmoe.validation import check, is_positive_int

SYNTHETIC_LOSS = ("all", "answer")  # which tokens of a task document are training targets


def valid_length_range(r: object) -> bool:
    """``[lo, hi]`` with ``0 < lo <= hi < 1``: task-document lengths as fractions of the window."""
    return (
        isinstance(r, (list, tuple))
        and len(r) == 2
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in r)
        and 0.0 < r[0] <= r[1] < 1.0
    )


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
        check_types(self, f"{p}.")
        check(isinstance(self.name, str) and bool(self.name), f"{p}.name", self.name, "a non-empty string")
        for n in ("window", "tokens", "batch_size", "replay_window"):
            check(is_positive_int(getattr(self, n)), f"{p}.{n}", getattr(self, n), "a positive integer")
        check(
            0.0 <= self.replay_fraction < 1.0,
            f"{p}.replay_fraction",
            self.replay_fraction,
            "a float in [0, 1)",
        )
        for n in ("mix", "replay_mix"):
            m = getattr(self, n)
            check(
                isinstance(m, dict)
                and m
                and all(isinstance(w, (int, float)) and w >= 0 for w in m.values())
                and sum(m.values()) > 0,
                f"{p}.{n}",
                m,
                "a non-empty dict source -> non-negative weight with a positive sum",
            )
        check(
            self.synthetic_loss in SYNTHETIC_LOSS,
            f"{p}.synthetic_loss",
            self.synthetic_loss,
            f"one of {SYNTHETIC_LOSS}",
        )
        check(
            self.synthetic_length is None or valid_length_range(self.synthetic_length),
            f"{p}.synthetic_length",
            self.synthetic_length,
            "null or [lo, hi] with 0 < lo <= hi < 1 (fractions of the window)",
        )
        if self.replay_fraction > 0:
            check(
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
