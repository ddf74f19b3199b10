"""Typed results of the recipe (JSON round trip, so a rerun can report from stored runs)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainRun:
    """One extractor's training: ``inputs`` "image" (the main model) or "text" (the control)."""

    inputs: str
    steps: int
    seconds: float
    params: int
    curve: list[list[float]] = field(default_factory=list)  # [step, train loss, held-out form_easy F1]
    cpu_seconds: float | None = None  # CPU time of the training (None: a run from before it was kept)


@dataclass
class PretrainCheck:
    """Text validation loss (nats/token) of a text-only LM and the same LM also fed image documents."""

    steps: int
    text_tokens: int  # text tokens each model was trained on (equal by construction)
    image_rows: int  # image-document rows the mixed model saw in addition
    text_only_val: float
    mixed_val: float
    margin: float

    @property
    def delta(self) -> float:
        return self.mixed_val - self.text_only_val

    @property
    def passed(self) -> bool:
        return self.delta <= self.margin


@dataclass
class Example:
    family: str
    doc_id: str
    target: str
    prediction: str
    f1: float
    image: str  # file name under OUT/examples/


@dataclass
class VisionExtractResult:
    main: TrainRun
    main_eval: dict[str, dict[str, Any]]  # family -> extract summary cell
    control: TrainRun | None = None
    control_eval: dict[str, dict[str, Any]] | None = None
    pretrain: PretrainCheck | None = None
    examples: list[Example] = field(default_factory=list)
    target_f1: float = 0.9
    target_family: str = "form_easy"  # runs before form_varied held form_easy against the target
    control_lr: dict[str, Any] | None = None  # the control's lr choice on validation pages (control.py)
    target_families: list[str] = field(default_factory=list)  # each held against target_f1 (empty: the one)
    errors: dict[str, Any] | None = None  # the main model's wrong fields classified (errors.classify)

    def form_easy_f1(self) -> float | None:
        c = self.main_eval.get("form_easy")
        return None if c is None else float(c["micro_f1"])

    def target_family_f1(self) -> float | None:
        c = self.main_eval.get(self.target_family)
        return None if c is None else float(c["micro_f1"])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.pretrain is not None:
            d["pretrain"].update(delta=self.pretrain.delta, passed=self.pretrain.passed)
        d["form_easy_f1"] = self.form_easy_f1()
        d["target_family_f1"] = self.target_family_f1()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> VisionExtractResult:
        pre = d.get("pretrain")
        if pre is not None:
            pre = PretrainCheck(**{k: v for k, v in pre.items() if k not in ("delta", "passed")})
        return cls(
            main=TrainRun(**d["main"]),
            main_eval=d["main_eval"],
            control=TrainRun(**d["control"]) if d.get("control") else None,
            control_eval=d.get("control_eval"),
            pretrain=pre,
            examples=[Example(**e) for e in d.get("examples", [])],
            target_f1=d.get("target_f1", 0.9),
            target_family=d.get("target_family", "form_easy"),
            control_lr=d.get("control_lr"),
            target_families=d.get("target_families", []),
            errors=d.get("errors"),
        )
