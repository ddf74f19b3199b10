"""What the demo measured: the curriculum, validation loss against a unigram baseline, a sample, and
associative recall of a small hybrid trained on MQAR.

``DemoResult.to_dict()`` is ``report.json``; the field order is that file's key order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StageResult:
    """One curriculum stage and the validation loss at its window when it ended."""

    name: str
    window: int
    tokens: int
    replay_fraction: float
    val_loss_at_end: float | None


@dataclass(frozen=True)
class LengthEval:
    """Validation loss of the final model at one window length, beside a unigram model's."""

    length: int
    val_loss: float
    unigram_loss: float
    beyond_training: bool


@dataclass(frozen=True)
class Sample:
    prompt: str
    completion: str


@dataclass(frozen=True)
class RecallResult:
    """A small hybrid trained on MQAR (``longmoe.tasks.mqar``) at ``train_len`` tokens, and its held-out
    recall accuracy at each eval length (keys: tokens, as text) over ``answers`` answers per length."""

    pattern: str
    d_model: int
    params: int
    n_pairs: int
    train_len: int
    steps: int
    train_seconds: float
    solved: bool
    chance: float
    answers: int
    accuracy: dict[str, float]


@dataclass(frozen=True)
class DemoResult:
    params: int
    steps: int
    tokens: int
    train_seconds: float
    synthetic_documents: bool
    stages: list[StageResult]
    eval: list[LengthEval]
    sample: Sample
    plots: list[str]
    recall: RecallResult | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DemoResult:
        return cls(
            **{
                **d,
                "stages": [StageResult(**s) for s in d["stages"]],
                "eval": [LengthEval(**e) for e in d["eval"]],
                "sample": Sample(**d["sample"]),
                "recall": RecallResult(**d["recall"]) if d.get("recall") else None,
            }
        )
