"""What the ablation measured, per pattern and overall.

``TrainResult`` is a pattern's ``recipe_done.json`` (field order = key order), ``EvalResult`` its
evaluation (the task grid summary of ``longmoe.eval.longctx.runner``, the loss by position of
``longmoe.eval.ppl``, answer losses, the generated answers), ``Check`` one expected outcome with its
verdict, and ``RecipeResult`` all of it; ``RecipeResult.to_dict()`` is ``results.json``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from longmoe.pipelines.longctx_tiny.config import RecipeConfig

# one row of ``longmoe.eval.longctx.runner.summarize``: task, length (, variant), n and each metric's mean
SummaryRow = dict[str, Any]


@dataclass
class TrainResult:
    """A finished pattern's training: ``Trainer.fit``'s summary, the size, the last losses."""

    steps: int
    tokens: int
    skipped_steps: int = 0
    val_loss_at_stage_end: dict[str, float] = field(default_factory=dict)
    params: int = 0
    train_loss_last10: float | None = None
    val_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainResult:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class AnswerLoss:
    """Mean teacher-forced loss of the answer tokens given the prompt, over ``n`` items of a cell."""

    task: str
    variant: str  # "*" pools every variant of the task
    length: int
    n: int
    answer_nll: float


@dataclass
class EvalResult:
    """One pattern's evaluation: accuracies, loss by position, answer losses, generated answers."""

    by_length: list[SummaryRow]
    by_variant: list[SummaryRow]
    ppl: dict[str, Any]  # ``longmoe.eval.ppl.ppl_by_position``'s result
    answer_nll: list[AnswerLoss] = field(default_factory=list)
    predictions: list[str] = field(default_factory=list)  # greedy answers, stripped

    def accuracy(self, task: str, length: int, metric: str = "all") -> float:
        for r in self.by_length:
            if r["task"] == task and r["length"] == length:
                return r[metric]
        return math.nan

    def pooled_accuracy(self, tasks: list[str], lengths: list[int]) -> tuple[float, int]:
        """Item-weighted accuracy over ``tasks`` x ``lengths``, and the number of items behind it."""
        return pooled([r for r in self.by_length if r["task"] in tasks and r["length"] in lengths])

    def variant_accuracy(self, task: str, variant: str, lengths: list[int]) -> tuple[float, int]:
        rows = self.by_variant
        return pooled(
            [r for r in rows if r["task"] == task and r["variant"] == variant and r["length"] in lengths]
        )

    def variants(self) -> set[tuple[str, str]]:
        return {(r["task"], r["variant"]) for r in self.by_variant}

    def answer_loss(self, task: str, variant: str, lengths: list[int]) -> float:
        """Mean answer loss of the (task, variant) cells at ``lengths`` (NaN when none was measured)."""
        xs = [
            a.answer_nll
            for a in self.answer_nll
            if a.task == task and a.variant == variant and a.length in lengths
        ]
        return sum(xs) / len(xs) if xs else math.nan


def pooled(rows: list[SummaryRow]) -> tuple[float, int]:
    """Item-weighted mean accuracy ("all") over summary rows, and the number of items behind it."""
    n = sum(r["n"] for r in rows)
    return (sum(r["all"] * r["n"] for r in rows) / n, n) if n else (math.nan, 0)


@dataclass(frozen=True)
class Check:
    """An expected outcome (``claim``: a beats b), the two numbers and the verdict on them."""

    claim: str
    verdict: str
    evidence: str
    a: float
    b: float


@dataclass
class RecipeResult:
    config: RecipeConfig
    trained: dict[str, TrainResult]
    evals: dict[str, EvalResult]
    checks: list[Check]

    @property
    def patterns(self) -> list[str]:
        """The evaluated patterns, in run order."""
        return list(self.evals)

    def to_dict(self) -> dict[str, Any]:
        pats = self.patterns
        return {
            "config": self.config.to_dict(),
            "trained": {p: t.to_dict() for p, t in self.trained.items()},
            "checks": [dataclasses.asdict(c) for c in self.checks],
            "accuracy": {p: self.evals[p].by_length for p in pats},
            "by_variant": {p: self.evals[p].by_variant for p in pats},
            "ppl": {p: {k: v for k, v in self.evals[p].ppl.items() if k != "buckets"} for p in pats},
        }
