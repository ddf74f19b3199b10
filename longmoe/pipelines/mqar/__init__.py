"""Multi-query associative recall (MQAR) sweep: recall vs state capacity, and length extrapolation.

``python -m longmoe.pipelines.mqar [--quick] [--jobs N] [--out DIR]`` (settings: ``config.json`` here,
``config.SweepConfig``). For every layer pattern (``L``, ``M``, ``LLLM``, ``LM``; ``model.model_config``),
width, pair count, position control and seed it trains a small dense-FFN ``LongMoE`` on fresh
``longmoe.tasks.mqar`` rows at each learning rate (early stop at 0.99 validation accuracy), keeps the
lr with the best mean validation accuracy over seeds, tests it on separate test rows at 1x/4x/16x the
training length (``run``; row seed ranges: ``seeds``), checks the issue's expectations (``checks``)
and writes ``OUT/report.md``, ``OUT/results.json`` and plots (``report``). Each finished run is stored
as ``OUT/runs/<cell>.json`` and a rerun skips it. See docs/evidence.md for the measured sweep.

``--long``: the long-row stage (``long_config``, ``long_run``, ``long_eval``, ``long_report``): models
trained as sweep cells, tested on rows of 4K-64K+ tokens with the queries near their pairs or anywhere
in the row, read at the answer positions only; results in docs/benchmarks.md.
"""

from longmoe.pipelines.mqar.config import CONFIG_FILE, Cell, SweepConfig
from longmoe.pipelines.mqar.result import Check, RunResult, SweepResult
from longmoe.pipelines.mqar.run import run_cell, run_sweep, train_cell

__all__ = [
    "CONFIG_FILE",
    "Cell",
    "Check",
    "RunResult",
    "SweepConfig",
    "SweepResult",
    "run_cell",
    "run_sweep",
    "train_cell",
]
