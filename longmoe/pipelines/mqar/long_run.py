"""The long-row stage: models trained at the sweep's short length, tested on rows of 4K-64K+ tokens.

For every seed, then every variant (so a stage cut short holds whole seeds): train the cell as the sweep
does (``run.fit_cell``: same rows, early stop, checkpointer) or load its stored weights, then measure
recall at every length and placement on rows no training or selection step saw
(``seeds.long_test_seed``), row by row through ``long_eval.recall``; then the ``far_*`` variants and
seeds at ``far_lengths``. Stored under ``OUT/long/``:

- ``<cell key>.safetensors``: the trained weights (a rerun loads them, never retrains);
- ``<cell key>.json``: the training result at the training length (test rows) and every measurement
  so far, written after each one (a rerun measures only what is missing).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from longmoe.model import LongMoE
from longmoe.pipelines.mqar.config import Cell, SweepConfig
from longmoe.pipelines.mqar.long_config import LongConfig, Variant
from longmoe.pipelines.mqar.long_eval import recall
from longmoe.pipelines.mqar.model import build, model_config
from longmoe.pipelines.mqar.result import RunResult
from longmoe.pipelines.mqar.run import fit_cell
from longmoe.pipelines.mqar.seeds import long_test_seed
from longmoe.tasks.mqar import MQARBatch, placed

LONG_DIR = "long"


def cell_of(v: Variant, lc: LongConfig, seed: int) -> Cell:
    return Cell(v.pattern, lc.d_model, lc.n_pairs, v.position, v.lr, seed, v.logn_scale)


def _model_of(trained: nn.Module) -> LongMoE:
    return trained["model"] if isinstance(trained, nn.ModuleDict) else trained  # type: ignore[return-value]


def _store(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)  # atomic: a killed stage leaves the last whole record


def trained_model(
    cell: Cell, rc: SweepConfig, out: Path, log: Callable[[str], None]
) -> tuple[LongMoE, dict[str, Any]]:
    """The cell's model (eval mode) and its record: loaded from ``OUT/long/<key>.*`` when stored, else
    trained (``fit_cell``, checkpoints in ``OUT/long/<key>.train/`` until done) and stored."""
    d = out / LONG_DIR
    weights, rec_file = d / f"{cell.key}.safetensors", d / f"{cell.key}.json"
    if weights.is_file() and rec_file.is_file():
        record = json.loads(rec_file.read_text())
        cfg = model_config(
            cell.pattern, cell.d_model, rc.vocab_size, rc.train_len, rc.attn_res, rc.init_std, cell.logn_scale
        )
        model, trained = build(cfg, cell.position)
        trained.load_state_dict(load_file(str(weights)))
        return model.eval(), record
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.process_time()
    result, trained = fit_cell(cell, rc, run_dir=d / f"{cell.key}.train")
    record = {
        "cell": asdict(cell),
        "train": result.to_dict(),
        "train_cpu_s": round(time.process_time() - t0, 1),
        "recall": {},
    }
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(weights))
    _store(rec_file, record)
    shutil.rmtree(d / f"{cell.key}.train", ignore_errors=True)  # the weights are the run now
    acc = RunResult.from_dict(result.to_dict()).acc(rc.train_len)
    log(
        f"{cell.key}: trained {result.steps} steps, test acc @ {rc.train_len} {acc:.3f} "
        f"({record['train_cpu_s']:.0f} CPU s)"
    )
    return _model_of(trained).eval(), record


def measure(
    model: LongMoE, cell: Cell, rc: SweepConfig, lc: LongConfig, placement: str, n: int, rows: int
) -> dict[str, Any]:
    """Recall on ``rows`` test rows of ``n`` tokens, read one row at a time (memory stays one row's)."""
    t0, w0 = time.process_time(), time.perf_counter()
    right = total = 0
    ent: list[float] = []
    rows_b = placed(
        long_test_seed(n, placement), rows, rc.vocab_size, n, cell.n_pairs, placement, rc.train_len, rc.alpha
    )
    for i in range(rows):
        b = MQARBatch(rows_b.input_ids[i : i + 1], rows_b.labels[i : i + 1], rows_b.distance[i : i + 1])
        r = recall(model, b, lc.chunk)
        right, total = right + r.correct, total + r.answers
        if r.entropy is not None:
            ent.append(r.entropy)
    return {
        "correct": right,
        "answers": total,
        "acc": round(right / total, 4),
        "rows": rows,
        "entropy": round(sum(ent) / len(ent), 4) if ent else None,
        "cpu_s": round(time.process_time() - t0, 1),
        "wall_s": round(time.perf_counter() - w0, 1),
    }


def _evaluate(
    model: LongMoE,
    record: dict[str, Any],
    cell: Cell,
    rc: SweepConfig,
    lc: LongConfig,
    v: Variant,
    lengths: list[int],
    far: bool,
    out: Path,
    log: Callable[[str], None],
) -> None:
    rec_file = out / LONG_DIR / f"{cell.key}.json"
    for n in lengths:
        for placement in lc.placements:
            done = record["recall"].setdefault(placement, {})
            rows = lc.rows_at(v, n, far)
            if str(n) in done and done[str(n)]["rows"] >= rows:
                continue
            m = measure(model, cell, rc, lc, placement, n, rows)
            done[str(n)] = m
            _store(rec_file, record)
            log(
                f"{cell.key} {placement} @ {n}: {m['acc']:.3f} of {m['answers']} (entropy {m['entropy']}, "
                f"{m['cpu_s']:.0f} CPU s)"
            )


def run_long(
    lc: LongConfig, rc: SweepConfig, out: Path, log: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Every seed x variant (trained or loaded, then measured), then the far lengths; the records.
    ``log``: a line per model and measurement (default: printed, flushed, so a log file follows it)."""
    log = log or partial(print, flush=True)
    torch.set_num_threads(lc.threads)
    records: dict[str, dict[str, Any]] = {}
    for seed in lc.seeds:
        for v in lc.variants:
            cell = cell_of(v, lc, seed)
            model, rec = trained_model(cell, rc, out, log)
            _evaluate(model, rec, cell, rc, lc, v, lc.lengths, False, out, log)
            records[cell.key] = rec
    for name in lc.far_variants:
        v = lc.variant(name)
        for seed in lc.far_seeds:
            cell = cell_of(v, lc, seed)
            model, rec = trained_model(cell, rc, out, log)
            _evaluate(model, rec, cell, rc, lc, v, lc.far_lengths, True, out, log)
            records[cell.key] = rec
    return list(records.values())


def stored_records(lc: LongConfig, out: Path) -> list[dict[str, Any]]:
    """The records of ``lc``'s cells stored under ``out`` so far (what a report-only pass reads)."""
    keys = {cell_of(v, lc, s).key for v in lc.variants for s in lc.seeds}
    keys |= {cell_of(lc.variant(n), lc, s).key for n in lc.far_variants for s in lc.far_seeds}
    files = [out / LONG_DIR / f"{k}.json" for k in sorted(keys)]
    return [json.loads(f.read_text()) for f in files if f.is_file()]
