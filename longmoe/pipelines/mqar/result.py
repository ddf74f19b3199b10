"""What the sweep measured: one ``RunResult`` per training run (``OUT/runs/<cell>.json``), the best
learning rate per cell, and the verdicts on the issue's expectations.

``PROTOCOL`` 2 runs hold test-row accuracy in ``accuracy`` and validation-row accuracy in
``val_accuracy``; runs stored before it (no ``protocol`` key, read as 1) were scored on the validation
rows only, so their ``accuracy`` is the selection rows' number (the report says so).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from longmoe.pipelines.mqar.config import Cell

PROTOCOL = 2  # separate validation (selection) and test (reported) rows


@dataclass(frozen=True)
class RunResult:
    """One run: the cell, its size, how long it trained, its validation accuracy curve at the training
    length (``(step, train loss, accuracy)``), its test accuracy by eval length (keys: tokens, as text)
    and its validation accuracy by eval length."""

    cell: Cell
    params: int
    kda_state: int
    steps: int
    solved: bool
    train_seconds: float
    curve: list[tuple[int, float, float]]
    accuracy: dict[str, float]
    val_accuracy: dict[str, float] = field(default_factory=dict)
    protocol: int = 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        return cls(**{**d, "cell": Cell(**d["cell"]), "curve": [tuple(c) for c in d["curve"]]})

    def acc(self, length: int) -> float:
        """The reported (test-row) accuracy at ``length`` (a protocol-1 run: its validation rows)."""
        return self.accuracy[str(length)]

    def val_acc(self, length: int) -> float:
        """The validation-row accuracy at ``length``: what early stopping and the lr choice use."""
        return self.val_accuracy.get(str(length), self.accuracy[str(length)])

    @property
    def legacy(self) -> bool:
        """Stored before the test rows existed: ``acc`` is the selection rows' accuracy."""
        return self.protocol < PROTOCOL


@dataclass(frozen=True)
class Check:
    """An expectation of the issue, its verdict and the numbers behind it."""

    claim: str
    verdict: str  # "confirmed", "not confirmed", "not measured"
    evidence: str


@dataclass
class SweepResult:
    runs: list[RunResult]
    best: list[RunResult]  # per cell and seed, the run at the cell's chosen lr (best mean validation)
    checks: list[Check] = field(default_factory=list)
    sanity: RunResult | None = None
    distances: list[dict[str, Any]] = field(default_factory=list)  # report.distances: per pairs x length

    def to_dict(self) -> dict[str, Any]:
        return {
            "sanity": None if self.sanity is None else self.sanity.to_dict(),
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "distances": self.distances,
            "best": [r.to_dict() for r in self.best],
            "runs": [r.to_dict() for r in self.runs],
        }
