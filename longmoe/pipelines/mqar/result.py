"""What the sweep measured: one ``RunResult`` per training run (``OUT/runs/<cell>.json``), the best
learning rate per cell, and the verdicts on the issue's expectations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from longmoe.pipelines.mqar.config import Cell


@dataclass(frozen=True)
class RunResult:
    """One run: the cell, its size, how long it trained, its held-out accuracy curve at the training
    length (``(step, train loss, accuracy)``) and its accuracy by eval length (keys: tokens, as text)."""

    cell: Cell
    params: int
    kda_state: int
    steps: int
    solved: bool
    train_seconds: float
    curve: list[tuple[int, float, float]]
    accuracy: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        return cls(**{**d, "cell": Cell(**d["cell"]), "curve": [tuple(c) for c in d["curve"]]})

    def acc(self, length: int) -> float:
        return self.accuracy[str(length)]


@dataclass(frozen=True)
class Check:
    """An expectation of the issue, its verdict and the numbers behind it."""

    claim: str
    verdict: str  # "confirmed", "not confirmed", "not measured"
    evidence: str


@dataclass
class SweepResult:
    runs: list[RunResult]
    best: list[RunResult]  # per cell group, the run with the best training-length accuracy
    checks: list[Check] = field(default_factory=list)
    sanity: RunResult | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "sanity": None if self.sanity is None else self.sanity.to_dict(),
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "best": [r.to_dict() for r in self.best],
            "runs": [r.to_dict() for r in self.runs],
        }
