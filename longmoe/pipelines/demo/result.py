"""What the demo measured: the curriculum, validation loss against a unigram baseline, a sample.

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
            }
        )
