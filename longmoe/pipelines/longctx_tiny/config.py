"""The ablation's settings (``config.json`` beside this file; ``retrieval.json`` is the niah-only variant)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longmoe.configio import JsonConfig, dataclass_from_dict, load_json
from longmoe.tasks import TASKS
from longmoe.train.mix import SYNTHETIC_LOSS, SYNTHETIC_TASKS, valid_length_range

CONFIG_FILE = Path(__file__).with_name("config.json")


@dataclass
class RecipeConfig(JsonConfig):
    patterns: list[str] = field(default_factory=lambda: ["L", "M", "LLLM"])
    reference_pattern: str = "LLLM"
    preset: str = "tiny"
    window: int = 512
    tokens: int = 6_000_000
    batch_size: int = 8
    synthetic_share: float = 0.8
    synthetic_tasks: list[str] = field(default_factory=lambda: list(SYNTHETIC_TASKS))
    synthetic_length: list[float] = field(default_factory=lambda: [0.2, 0.9])
    short_docs_fraction: float = 0.5  # share of the tokens in a first stage of short task documents
    short_docs_length: list[float] = field(default_factory=lambda: [0.1, 0.5])
    synthetic_loss: str = "answer"  # task documents train on their answers (see the package doc)
    lr: float = 3e-3
    warmup_steps: int = 20
    seed: int = 0
    tokenizer_vocab: int = 2048
    tokenizer_chars: int = 5_000_000
    eval_tasks: list[str] = field(default_factory=lambda: list(SYNTHETIC_TASKS))
    eval_multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    eval_depths: int = 3
    eval_n: int = 6
    eval_seed: int = 1000
    ppl_docs: int = 2

    def __post_init__(self) -> None:
        bad = [p for p in self.patterns if not p or set(p) - {"L", "M"}]
        if bad or not self.patterns:
            raise ValueError(f"patterns={self.patterns} is invalid: expected strings of 'L' and 'M'")
        if self.window < 128 or self.tokens < self.window:
            raise ValueError(
                f"window={self.window}, tokens={self.tokens}: expected window >= 128, tokens >= window"
            )
        if not self.synthetic_tasks or set(self.synthetic_tasks) - set(SYNTHETIC_TASKS):
            raise ValueError(
                f"synthetic_tasks={self.synthetic_tasks} is invalid: "
                f"expected a non-empty list from {SYNTHETIC_TASKS}"
            )
        if not self.eval_tasks or set(self.eval_tasks) - set(TASKS):
            raise ValueError(
                f"eval_tasks={self.eval_tasks} is invalid: expected a non-empty list from {list(TASKS)}"
            )
        if not 0.0 <= self.synthetic_share < 1.0:
            raise ValueError(f"synthetic_share={self.synthetic_share} is invalid: expected a float in [0, 1)")
        if self.synthetic_loss not in SYNTHETIC_LOSS:
            raise ValueError(
                f"synthetic_loss={self.synthetic_loss!r} is invalid: expected one of {SYNTHETIC_LOSS}"
            )
        for name in ("synthetic_length", "short_docs_length"):
            rng = getattr(self, name)
            if not (isinstance(rng, list) and valid_length_range(rng)):
                raise ValueError(f"{name}={rng} is invalid: expected [lo, hi] with 0 < lo <= hi < 1")
        if not 0.0 <= self.short_docs_fraction < 1.0:
            raise ValueError(
                f"short_docs_fraction={self.short_docs_fraction} is invalid: expected a float in [0, 1)"
            )
        if not self.eval_multiples or min(self.eval_multiples) < 1:
            raise ValueError(f"eval_multiples={self.eval_multiples} is invalid: expected integers >= 1")

    @property
    def eval_lengths(self) -> list[int]:
        """The evaluation lengths in tokens: ``eval_multiples`` x ``window``."""
        return [m * self.window for m in self.eval_multiples]

    @property
    def beyond_lengths(self) -> list[int]:
        """The evaluation lengths past the training window."""
        return [n for n in self.eval_lengths if n > self.window]

    @classmethod
    def load(cls, path: str | Path = CONFIG_FILE, **overrides: Any) -> RecipeConfig:
        """The settings in ``path`` with the non-None ``overrides`` on top; unknown names are errors
        (``longmoe.config.ConfigError``, naming the file and the field)."""
        d = load_json(path)
        d.update({k: v for k, v in overrides.items() if v is not None})
        return dataclass_from_dict(cls, d, where=str(path))
