"""What the ablations run: studies, budgets, seeds (``AblationConfig``), and each run's identity."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

STUDIES = ("decay", "attnres", "balance")
# KDA gate, both through the all-GEMM (factorised) chunk path; "-hot": the same at HOT_LR_SCALE x the
# learning rate (a stress test that pushes the decay gate harder)
DECAY_ARMS = ("bounded", "softplus", "bounded-hot", "softplus-hot")
HOT_LR_SCALE = 10.0
DEPTHS = ("tiny", "deep")  # attnres: the tiny depth and a deeper, thinner stack
ATTNRES_ARMS = tuple(f"{res}-{depth}" for depth in DEPTHS for res in ("attnres", "plain"))
BALANCE_ARMS = ("quantile", "sign", "aux", "none")
ARMS = {"decay": DECAY_ARMS, "attnres": ATTNRES_ARMS, "balance": BALANCE_ARMS}


@dataclass(frozen=True)
class AblationConfig:
    """Budgets of the three studies. Every run of a study sees the same tokens (``steps`` batches of
    ``batch_size`` windows of ``window`` tokens) and the same seeds (seed ``s`` fixes init and data
    order); the full settings take ~6 minutes on a shared 2-core machine, one thread per run (40 runs)."""

    studies: tuple[str, ...] = STUDIES
    arms: tuple[str, ...] = ()  # only these arms (empty: all), e.g. to split a study over processes
    window: int = 128
    batch_size: int = 4
    lr: float = 3e-3
    warmup_steps: int = 10
    val_windows: int = 8
    tokenizer_vocab: int = 512
    tokenizer_chars: int = 1_000_000  # characters of the corpus the BPE is trained on
    decay_steps: int = 120
    decay_seeds: int = 2
    attnres_steps: int = 60
    attnres_seeds: int = 3
    balance_steps: int = 200
    balance_seeds: int = 5  # report.BALANCE_MIN_SEEDS paired seeds for the loss-cost verdict
    balance_experts: int = 256
    balance_top_k: int = 8
    bias_step: float = 1e-2  # δ of the quantile and sign balancers
    aux_coef: float = 1e-2  # coefficient of the aux balance loss
    settle_steps: int = 20  # final MaxVio: mean over the last this many steps

    def __post_init__(self) -> None:
        bad = [s for s in self.studies if s not in STUDIES]
        if bad or not self.studies:
            raise ValueError(
                f"studies={list(self.studies)} is invalid: expected a non-empty subset of {STUDIES}"
            )
        known = {a for s in self.studies for a in ARMS[s]}
        if set(self.arms) - known:
            raise ValueError(
                f"arms={list(self.arms)} is invalid: expected arms of {list(self.studies)}: {sorted(known)}"
            )
        for name in ("window", "batch_size", "val_windows", "decay_steps", "decay_seeds", "attnres_steps",
                     "attnres_seeds", "balance_steps", "balance_seeds", "balance_experts", "balance_top_k",
                     "settle_steps"):  # fmt: skip
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}={v!r} is invalid: expected an integer >= 1")
        if self.window < 16:
            raise ValueError(f"window={self.window} is invalid: expected at least one KDA chunk (16 tokens)")
        if self.balance_top_k > self.balance_experts:
            raise ValueError(
                f"balance_top_k={self.balance_top_k} is invalid: expected <= balance_experts="
                f"{self.balance_experts}"
            )
        if not (self.lr > 0 and self.bias_step > 0 and self.aux_coef > 0):
            raise ValueError(
                f"lr={self.lr}, bias_step={self.bias_step}, aux_coef={self.aux_coef}: expected floats > 0"
            )

    @classmethod
    def quick(cls, **overrides: Any) -> AblationConfig:
        """A smoke run in seconds: every study, arm and code path, a few steps and one seed each."""
        small = dict(
            window=32, batch_size=2, warmup_steps=1, val_windows=1, tokenizer_vocab=300,
            tokenizer_chars=50_000,
            decay_steps=3, decay_seeds=1, attnres_steps=2, attnres_seeds=2, balance_steps=3, balance_seeds=1,
            balance_experts=16, balance_top_k=2, settle_steps=2,
        )  # fmt: skip
        return cls(**{**small, **overrides})

    def steps(self, study: str) -> int:
        return getattr(self, f"{study}_steps")

    def seeds(self, study: str) -> list[int]:
        return list(range(getattr(self, f"{study}_seeds")))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["studies"], d["arms"] = list(self.studies), list(self.arms)
        return d


@dataclass(frozen=True)
class RunKey:
    """One training run: ``study``, ``arm`` (one of ``ARMS[study]``), ``seed``."""

    study: str
    arm: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm}-seed{self.seed}"


def run_keys(cfg: AblationConfig) -> list[RunKey]:
    """Every run of the configured studies, seed-major inside a study (so a cut-short study has every arm
    at the first seeds)."""
    keys = [RunKey(s, arm, seed) for s in cfg.studies for seed in cfg.seeds(s) for arm in ARMS[s]]
    return [k for k in keys if not cfg.arms or k.arm in cfg.arms]
