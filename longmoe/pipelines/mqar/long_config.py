"""Settings of the long-row stage (``long_config.json`` beside this file; ``--quick``: a smoke run).

The stage trains one model per *variant* (pattern, position control, log-length scaling, lr) and seed
exactly as a sweep cell trains (the ``SweepConfig`` of ``--config``, by default ``config.json``:
64-token rows, early stop on the validation rows), at the lr the committed sweep chose for that
pattern on its validation rows (no lr search here; a scaled variant takes its plain pattern's lr),
then tests it on rows of ``lengths`` tokens with the queries placed ``near`` their pairs or
``uniform``ly over the row (``tasks.mqar.placed``), ``rows`` rows per length (``n_pairs`` answers
each), and the ``far_*`` variants at one seed at ``far_lengths``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from longmoe.configio import JsonConfig
from longmoe.pipelines.mqar.model import POSITIONS
from longmoe.pipelines.mqar.seeds import MAX_CELL_SEED, MAX_LONG_LEN
from longmoe.tasks.mqar import PLACEMENTS

LONG_CONFIG_FILE = Path(__file__).with_name("long_config.json")


@dataclass
class Variant:
    """One model family: layer pattern, position control, log-length scale ``s`` (0: off), its lr, and
    ``row_cap``: at most this many rows per length (0: no cap; a NoPE-only model's first layer attends
    quadratically, so its long rows cost ~T² where the hybrids' cost ~T)."""

    pattern: str
    position: str = "none"
    logn_scale: float = 0.0
    lr: float = 3e-3
    row_cap: int = 0

    @property
    def name(self) -> str:
        """``LLLM``, ``M+conv``, ``LLLM+logn`` ...: how tables and plots call it."""
        return (
            self.pattern
            + ("" if self.position == "none" else f"+{self.position}")
            + ("+logn" if self.logn_scale else "")
        )

    def validate(self) -> None:
        if not self.pattern or set(self.pattern) - {"L", "M"}:
            raise ValueError(f"variant pattern={self.pattern!r} is invalid: expected a string of 'L' and 'M'")
        if self.position not in POSITIONS:
            raise ValueError(f"variant position={self.position!r} is invalid: expected one of {POSITIONS}")
        if not 0 <= self.logn_scale < float("inf"):
            raise ValueError(f"variant logn_scale={self.logn_scale} is invalid: expected a finite float >= 0")
        if not self.lr > 0 or self.row_cap < 0:
            raise ValueError(f"variant {self.name}: lr={self.lr} must be > 0 and row_cap={self.row_cap} >= 0")


@dataclass
class LongConfig(JsonConfig):
    variants: list[Variant] = field(default_factory=lambda: [Variant("LLLM"), Variant("L")])
    n_pairs: int = 8
    d_model: int = 64
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    lengths: list[int] = field(default_factory=lambda: [4096, 16384, 65536])
    rows: list[int] = field(default_factory=lambda: [16, 8, 8])  # rows per length, aligned with lengths
    placements: list[str] = field(default_factory=lambda: list(PLACEMENTS))
    far_variants: list[str] = field(default_factory=lambda: ["LLLM"])  # by Variant.name
    far_seeds: list[int] = field(default_factory=lambda: [0])
    far_lengths: list[int] = field(default_factory=lambda: [262144])
    far_rows: list[int] = field(default_factory=lambda: [2])
    chunk: int = 8192  # prefill chunk of the readout (long_eval)
    threads: int = 1
    target: float = 0.9  # the target: hybrid recall at the longest length, queries uniform

    def __post_init__(self) -> None:
        self.variants = [Variant(**v) if isinstance(v, dict) else v for v in self.variants]
        for v in self.variants:
            v.validate()
        names = [v.name for v in self.variants]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"variants {names}: expected at least one, no two of the same name")
        for lens, rows, what in ((self.lengths, self.rows, ""), (self.far_lengths, self.far_rows, "far_")):
            if len(lens) != len(rows) or any(n < 1 for n in rows):
                raise ValueError(f"{what}rows={rows}: expected one positive row count per {what}length")
            if any(not 0 < n <= MAX_LONG_LEN for n in lens):
                raise ValueError(f"{what}lengths={lens}: expected lengths in [1, {MAX_LONG_LEN}]")
        if not self.lengths or not self.seeds or not self.placements:
            raise ValueError("lengths, seeds and placements: expected at least one value each")
        if set(self.placements) - set(PLACEMENTS):
            raise ValueError(f"placements={self.placements}: expected values from {PLACEMENTS}")
        if unknown := set(self.far_variants) - set(names):
            raise ValueError(f"far_variants {sorted(unknown)}: not among the variants {names}")
        if any(not 0 <= s < MAX_CELL_SEED for s in [*self.seeds, *self.far_seeds]):
            raise ValueError(f"seeds: expected integers in [0, {MAX_CELL_SEED})")
        for name in ("n_pairs", "d_model", "chunk", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid: expected a positive integer")
        if not 0 < self.target <= 1:
            raise ValueError(f"target={self.target} is invalid: expected a float in (0, 1]")

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    def rows_at(self, v: Variant, n: int, far: bool = False) -> int:
        """Rows at length ``n`` for variant ``v`` (its ``row_cap`` applied)."""
        lens, rows = (self.far_lengths, self.far_rows) if far else (self.lengths, self.rows)
        r = rows[lens.index(n)]
        return min(r, v.row_cap) if v.row_cap else r
