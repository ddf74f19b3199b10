"""The sweep's settings (``config.json`` beside this file is the committed sweep; ``--quick`` a smoke run).

A sweep trains one model per *cell* (pattern x d_model x pairs x position control x seed) at every
learning rate of ``lrs`` (Zoology's ``logspace(-3, -1.5, 4)``), early-stops each on the *validation*
rows, and keeps per cell the lr with the best mean validation accuracy over its seeds; the reported
accuracy is measured on separate *test* rows that neither early stopping nor the lr choice saw
(``seeds``: the row seed ranges). ``sanity`` is an easy cell that must be solved first (a run that
cannot solve it has a broken setup, not a result).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from longmoe.configio import JsonConfig
from longmoe.pipelines.mqar.model import POSITIONS
from longmoe.pipelines.mqar.seeds import MAX_CELL_SEED, MAX_STEPS
from longmoe.tasks.mqar import check_settings

CONFIG_FILE = Path(__file__).with_name("config.json")
# the fields that choose the cells (and the machine's threads, the checkpoint interval), not how one trains
SWEEP_ONLY = ("patterns", "d_models", "pairs", "positions", "control_patterns", "lrs", "seeds", "threads",
              "checkpoint_every", "sanity")  # fmt: skip
ZOOLOGY_LRS = tuple(round(10**e, 6) for e in (-3.0, -2.5, -2.0, -1.5))  # numpy.logspace(-3, -1.5, 4)


@dataclass(frozen=True)
class Cell:
    """One training run: what model, which task setting, at which learning rate and seed."""

    pattern: str
    d_model: int
    n_pairs: int
    position: str = "none"
    lr: float = 3e-3
    seed: int = 0
    logn_scale: float = 0.0  # ModelConfig.mla_logn_scale: log-length attention scaling (0.0: off)

    @property
    def key(self) -> str:
        """The run's file name stem (``runs/<key>.json``); ``-logn<s>`` only with the scaling on."""
        logn = f"-logn{self.logn_scale:g}" if self.logn_scale else ""
        return (
            f"{self.pattern}-d{self.d_model}-p{self.n_pairs}-{self.position}{logn}-lr{self.lr:g}-s{self.seed}"
        )

    @property
    def group(self) -> tuple[str, int, int, str, float, int]:
        """The cell without its learning rate: one seed's runs at every lr."""
        return (self.pattern, self.d_model, self.n_pairs, self.position, self.logn_scale, self.seed)

    @property
    def setting(self) -> tuple[str, int, int, str, float]:
        """The cell without lr and seed: its lr is chosen on the mean validation accuracy over seeds."""
        return (self.pattern, self.d_model, self.n_pairs, self.position, self.logn_scale)


@dataclass
class SweepConfig(JsonConfig):
    patterns: list[str] = field(default_factory=lambda: ["M", "L", "LM", "LLLM"])
    d_models: list[int] = field(default_factory=lambda: [64])
    pairs: list[int] = field(default_factory=lambda: [4, 16])
    positions: list[str] = field(default_factory=lambda: ["none", "conv"])
    control_patterns: list[str] = field(default_factory=lambda: ["M"])  # patterns also run with the controls
    lrs: list[float] = field(default_factory=lambda: list(ZOOLOGY_LRS))
    seeds: list[int] = field(default_factory=lambda: [0])  # config.json: 3 per cell
    vocab_size: int = 64
    train_len: int = 64
    eval_multiples: list[int] = field(default_factory=lambda: [1, 4, 16])
    alpha: float = 0.1
    steps: int = 300
    batch_size: int = 32
    warmup_steps: int = 20
    weight_decay: float = 0.1
    eval_every: int = 25
    eval_n: int = 128  # rows per accuracy measurement (n_pairs answers each)
    target_accuracy: float = 0.99  # early stop once the held-out accuracy reaches it
    attn_res: bool = False
    init_std: float = 0.1  # ModelConfig.init_std (its 0.02 default left 1,000-step probes at chance)
    threads: int = 1
    checkpoint_every: int = 100  # steps between a cell's checkpoints (OUT/runs/<cell>/checkpoints/)
    sanity: Cell = field(default_factory=lambda: Cell("LM", 64, 4, "none", 1e-2, 0))

    def __post_init__(self) -> None:
        if isinstance(self.sanity, dict):
            self.sanity = Cell(**self.sanity)
        bad = [p for p in self.patterns if not p or set(p) - {"L", "M"}]
        if bad or not self.patterns:
            raise ValueError(f"patterns={self.patterns} is invalid: expected strings of 'L' and 'M'")
        if set(self.positions) - set(POSITIONS) or not self.positions:
            raise ValueError(
                f"positions={self.positions} is invalid: expected a non-empty list from {POSITIONS}"
            )
        for name in ("d_models", "pairs", "lrs", "seeds", "eval_multiples"):
            if not getattr(self, name):
                raise ValueError(f"{name} is empty: expected at least one value")
        if any(d < 2 or d % 2 for d in self.d_models):
            raise ValueError(f"d_models={self.d_models} is invalid: expected even widths >= 2")
        if any(not lr > 0 for lr in self.lrs):
            raise ValueError(f"lrs={self.lrs} is invalid: expected learning rates > 0")
        if any(not 0 <= s < MAX_CELL_SEED for s in [*self.seeds, self.sanity.seed]):
            raise ValueError(f"seeds={self.seeds} is invalid: expected integers in [0, {MAX_CELL_SEED})")
        if self.steps >= MAX_STEPS:
            raise ValueError(f"steps={self.steps} is invalid: expected fewer than {MAX_STEPS}")
        if any(m < 1 for m in self.eval_multiples):
            raise ValueError(f"eval_multiples={self.eval_multiples} is invalid: expected integers >= 1")
        for name in ("steps", "batch_size", "eval_every", "eval_n", "threads", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid: expected a positive integer")
        if not self.init_std > 0:
            raise ValueError(f"init_std={self.init_std} is invalid: expected a float > 0")
        if not 0 < self.target_accuracy <= 1:
            raise ValueError(f"target_accuracy={self.target_accuracy} is invalid: expected a float in (0, 1]")
        for p in [*self.pairs, self.sanity.n_pairs]:  # every cell's task must be possible (TaskError)
            check_settings(self.vocab_size, self.train_len, p, p, self.alpha)

    def cells(self) -> list[Cell]:
        """Every run of the sweep, pattern by pattern (in config order), small pairs and widths first;
        position controls other than "none" only for ``control_patterns``."""
        return [
            Cell(pat, d, p, pos, lr, s)
            for pat in self.patterns
            for pos in self.positions
            if pos == "none" or pat in self.control_patterns
            for p in self.pairs
            for d in self.d_models
            for s in self.seeds
            for lr in self.lrs
        ]

    def training_settings(self) -> dict[str, object]:
        """What decides how a cell trains (a cell's run directory keeps it: a resumed cell refuses
        others); the fields that choose which cells run, or the threads, are not in it."""
        return {k: v for k, v in self.to_dict().items() if k not in SWEEP_ONLY}

    @property
    def eval_lengths(self) -> list[int]:
        return [self.train_len * m for m in self.eval_multiples]
