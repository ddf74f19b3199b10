"""The demo's recall part: a 2-layer hybrid (one KDA, one NoPE MLA layer) trained on MQAR at 64 tokens
and tested at 1x/4x/16x that length, through the MQAR sweep's own run (``pipelines.mqar``).

It is the architecture's point at a size a CPU trains in a minute or two: the KDA layer's short conv
and recurrence give order, the MLA layer looks values up by key at any distance. The run is stored
as ``RUN/recall/runs/<cell>.json``, so ``--resume`` reads it instead of training again.
"""

from __future__ import annotations

from longmoe.pipelines.demo.config import DemoConfig
from longmoe.pipelines.demo.result import RecallResult
from longmoe.pipelines.mqar.checks import answers, chance
from longmoe.pipelines.mqar.config import Cell, SweepConfig
from longmoe.pipelines.mqar.run import run_cell

RECALL_DIR = "recall"
PATTERN, D_MODEL, LR = "LM", 64, 1e-2
TRAIN_LEN, VOCAB = 64, 64


def recall_config(cfg: DemoConfig) -> tuple[SweepConfig, Cell]:
    """The MQAR setting: ``cfg.recall_steps`` and ``cfg.recall_eval_n`` shrink with ``cfg.scale`` < 1."""
    s = min(1.0, cfg.scale)
    rc = SweepConfig(
        patterns=[PATTERN], d_models=[D_MODEL], pairs=[cfg.recall_pairs], positions=["none"], lrs=[LR],
        seeds=[cfg.seed], vocab_size=VOCAB, train_len=TRAIN_LEN, eval_multiples=[1, 4, 16],
        steps=max(10, round(cfg.recall_steps * s)), eval_n=max(8, round(cfg.recall_eval_n * s)),
        sanity=Cell(PATTERN, D_MODEL, cfg.recall_pairs, "none", LR, cfg.seed),
    )  # fmt: skip
    return rc, rc.sanity


def run_recall(cfg: DemoConfig) -> RecallResult:
    """Train (or read back) the demo's MQAR hybrid and measure its recall at every eval length."""
    rc, cell = recall_config(cfg)
    r = run_cell(cell, rc, cfg.run_dir / RECALL_DIR)
    return RecallResult(
        pattern=PATTERN,
        d_model=D_MODEL,
        params=r.params,
        n_pairs=cell.n_pairs,
        train_len=rc.train_len,
        steps=r.steps,
        train_seconds=r.train_seconds,
        solved=r.solved,
        chance=chance(cell.n_pairs),  # a guess among the row's P in-context values, 1/P
        answers=answers(rc, cell.n_pairs),
        accuracy=r.accuracy,
    )
