"""What one ablation run measured (``RunResult``, its JSON file), arm summaries and verdicts."""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunResult:
    """One finished run. ``spec`` is what the run was trained with (a rerun with other settings retrains).

    ``loss_curve``: training loss per optimizer step (NaN where non-finite); ``skipped_steps``: steps
    whose gradient norm was not finite (the trainer skips them); ``diverged``: the trainer stopped after
    too many such steps in a row. Decay study: ``min_gamma`` / ``max_abs_o`` per step (``probes``).
    Balance study: ``max_vio_curve`` (windowed MaxVio, mean over MoE layers, per step), ``final_max_vio``
    (mean of its last ``settle_steps``), ``dead_experts`` (experts with no token in the final window,
    summed over layers).
    """

    study: str
    arm: str
    seed: int
    spec: dict[str, Any]
    params: int
    steps: int
    tokens: int
    seconds: float
    val_loss: float
    loss_curve: list[float]
    skipped_steps: int = 0
    nonfinite_loss_steps: int = 0
    diverged: bool = False
    min_gamma: list[float] = field(default_factory=list)
    max_abs_o: list[float] = field(default_factory=list)
    max_vio_curve: list[float] = field(default_factory=list)
    final_max_vio: float | None = None
    dead_experts: int | None = None
    router_entropy: float | None = None

    @property
    def train_loss_last(self) -> float:
        """Mean finite training loss over the last 10 steps (NaN when none is finite)."""
        tail = [x for x in self.loss_curve[-10:] if math.isfinite(x)]
        return statistics.mean(tail) if tail else math.nan

    @property
    def nonfinite_events(self) -> int:
        """Steps with a non-finite loss or gradient norm (a step with both counts once)."""
        return max(self.skipped_steps, self.nonfinite_loss_steps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (NaN with fewer than two values)."""
    xs = [float(x) for x in xs]
    if not xs:
        return math.nan, math.nan
    m = statistics.mean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan)


def paired_diff(a: list[RunResult], b: list[RunResult], metric: str) -> tuple[float, float, int]:
    """Mean and SE of ``metric(a) − metric(b)`` over the seeds both arms have (paired by seed)."""
    by_seed = {r.seed: r for r in b}
    d = [getattr(r, metric) - getattr(by_seed[r.seed], metric) for r in a if r.seed in by_seed]
    m, se = mean_se(d)
    return m, se, len(d)


@dataclass(frozen=True)
class Check:
    """One expectation of issue 25 with its verdict and the numbers behind it."""

    study: str
    expectation: str
    confirmed: bool
    evidence: str
    enough_seeds: bool = True  # False: too few seeds for a verdict either way

    @property
    def verdict(self) -> str:
        if not self.enough_seeds:
            return "not measured at enough seeds"
        return "confirmed" if self.confirmed else "not confirmed"
