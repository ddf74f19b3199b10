"""The sweep's runs: train one cell to 0.99 validation accuracy (or its step budget), test it at every
eval length on the test rows, store it as ``OUT/runs/<cell>.json``; a rerun reads the stored runs
instead of redoing them (a run stored before the test rows existed is retrained).

Training batches are fresh MQAR rows every step (seeded by the cell's seed and the step: no epochs,
no memorisation); the validation rows (early stop, lr choice) and the test rows (reported accuracy)
use seeds no training step uses and not each other's (``seeds``). The optimiser pieces are the
pretraining ones (``build_optimizer``, ``LRSchedule``'s warmup + cosine, ``seed_everything``), and so
is the checkpointer: an unfinished cell keeps ``OUT/runs/<cell>/`` (its settings and checkpoints every
``checkpoint_every`` steps) and a rerun resumes it to the result an uninterrupted run gives.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from longmoe.distributed.parallel_dims import ParallelDims
from longmoe.model import LongMoE
from longmoe.pipelines.mqar.checks import expected_checks
from longmoe.pipelines.mqar.config import Cell, SweepConfig
from longmoe.pipelines.mqar.model import build, kda_state_numbers, model_config
from longmoe.pipelines.mqar.report import write_report
from longmoe.pipelines.mqar.result import PROTOCOL, RunResult, SweepResult
from longmoe.pipelines.mqar.seeds import test_seed, train_seed, validation_seed
from longmoe.tasks.mqar import answer_accuracy, mqar
from longmoe.train.checkpointer import RNG, Checkpointer, Curve, ModuleState, Progress, Stateful
from longmoe.train.optim import LRSchedule, ScheduleConfig, build_optimizer
from longmoe.train.parallel import SingleProcess
from longmoe.train.rng import seed_everything
from longmoe.train.run import pin_config

RUNS_DIR = "runs"
CELL_CONFIG = "cell.json"  # OUT/runs/<key>/cell.json: what an unfinished cell was started with
CONFIG_OUT = "sweep_config.json"
GRAD_CLIP = 1.0
RECIPE_BETAS = (0.9, 0.98)


@torch.no_grad()
def accuracy(
    model: LongMoE,
    rc: SweepConfig,
    n_pairs: int,
    seq_len: int,
    chunk: int = 32,
    rows: Callable[[int], int] = validation_seed,
) -> float:
    """Answer accuracy (greedy) on ``rc.eval_n`` held-out rows of ``seq_len`` tokens drawn by
    ``rows(seq_len)`` (the validation rows unless told: pass ``seeds.test_seed`` for the reported one)."""
    b = mqar(rows(seq_len), rc.eval_n, rc.vocab_size, seq_len, n_pairs, rc.alpha)
    model.eval()
    right = total = 0
    for i in range(0, rc.eval_n, chunk):
        r, t = answer_accuracy(model(b.input_ids[i : i + chunk]).logits, b.labels[i : i + chunk])
        right, total = right + r, total + t
    model.train()
    return right / total


def train_cell(cell: Cell, rc: SweepConfig, log: bool = False, run_dir: Path | None = None) -> RunResult:
    """Train ``cell`` (early stop at ``rc.target_accuracy`` on the validation rows), then measure every
    eval length on the test rows (and the training length on the validation rows, for the lr choice).
    ``run_dir``: checkpoint there every ``rc.checkpoint_every`` steps and resume from it (``_run``)."""
    return fit_cell(cell, rc, log, run_dir)[0]


def fit_cell(
    cell: Cell, rc: SweepConfig, log: bool = False, run_dir: Path | None = None
) -> tuple[RunResult, nn.Module]:
    """``train_cell``, also returning what trained: the model, or ``ModuleDict(model=, conv=)`` with a
    position control (``model.build``), for evaluations beyond the sweep's lengths (``long``)."""
    torch.set_num_threads(rc.threads)
    cfg = model_config(
        cell.pattern, cell.d_model, rc.vocab_size, max(rc.eval_lengths), rc.attn_res, rc.init_std,
        cell.logn_scale,
    )  # fmt: skip
    seed_everything(cell.seed)
    model, trained = build(cfg, cell.position)
    opt = build_optimizer(trained, cell.lr, rc.weight_decay, betas=RECIPE_BETAS)
    sched = LRSchedule(opt, ScheduleConfig(lr=cell.lr, warmup_steps=rc.warmup_steps), rc.steps)
    done, curve = Progress(), Curve()  # curve.points: [step, train loss, held-out accuracy]
    cp = None if run_dir is None else _run(run_dir, cell, rc, model, trained, opt, sched, done, curve)
    while done.step < rc.steps:
        b = mqar(
            train_seed(cell.seed, done.step),
            rc.batch_size,
            rc.vocab_size,
            rc.train_len,
            cell.n_pairs,
            rc.alpha,
        )
        sched.apply()
        out = model(b.input_ids, labels=b.labels)
        opt.zero_grad(set_to_none=True)
        out.ce_loss.backward()
        nn.utils.clip_grad_norm_(trained.parameters(), GRAD_CLIP)
        opt.step()
        sched.advance()
        done.step += 1
        step, loss = done.step, float(out.ce_loss.detach())
        if step % rc.eval_every == 0 or step == rc.steps:
            acc = accuracy(model, rc, cell.n_pairs, rc.train_len)
            curve.points.append([step, round(loss, 4), round(acc, 4)])
            if log:
                print(f"  {cell.key} step {step}: loss {loss:.3f} acc {acc:.3f}", flush=True)
            if acc >= rc.target_accuracy:
                break
        if cp is not None and step % rc.checkpoint_every == 0:
            cp.save()
    t_train = curve.seconds
    by_len = {n: accuracy(model, rc, cell.n_pairs, n, rows=test_seed) for n in rc.eval_lengths}
    last = curve.points[-1]
    result = RunResult(
        cell=cell,
        params=sum(p.numel() for p in trained.parameters()),  # tied weights counted once
        kda_state=kda_state_numbers(cfg),
        steps=done.step,
        solved=last[2] >= rc.target_accuracy,
        train_seconds=round(t_train, 1),
        curve=[(int(s), lo, a) for s, lo, a in curve.points],
        accuracy={str(n): round(a, 4) for n, a in by_len.items()},
        val_accuracy={str(rc.train_len): last[2]},  # the stopped model's validation accuracy
        protocol=PROTOCOL,
    )
    return result, trained


def _run(
    run_dir: Path, cell: Cell, rc: SweepConfig, model: LongMoE, trained: nn.Module,
    opt: torch.optim.Optimizer, sched: LRSchedule, done: Progress, curve: Curve,
) -> Checkpointer:  # fmt: skip
    """A cell's run directory (``cell.json``: the cell and the sweep's training settings, written
    once; another is refused in one line) and its checkpointer, restored to the newest checkpoint.
    The batches are a function of the step, so they need no state; a position control's conv is a
    part of its own (the model's weights file holds the model alone)."""
    pin_config(run_dir / CELL_CONFIG, {"cell": asdict(cell), **rc.training_settings()}, f"cell {cell.key}")
    parts: dict[str, Stateful] = {"schedule": sched, "curve": curve, "rng": RNG()}
    if isinstance(trained, nn.ModuleDict):
        parts["control"] = ModuleState(trained["conv"])
    strategy = SingleProcess(ParallelDims(), torch.device("cpu"))
    cp = Checkpointer(run_dir, model, opt, strategy, model.cfg, None, done, parts, keep_last=1)
    cp.restore()
    return cp


def run_cell(cell: Cell, rc: SweepConfig, out: Path, log: bool = False) -> RunResult:
    """``train_cell``, or the stored result of a finished run (``OUT/runs/<key>.json``) unless that
    predates the test rows (``RunResult.legacy``: retrained, its file replaced). An unfinished run
    resumes from its checkpoints in ``OUT/runs/<key>/``, which go once its result is stored."""
    f = out / RUNS_DIR / f"{cell.key}.json"
    if f.is_file():
        stored = RunResult.from_dict(json.loads(f.read_text()))
        if not stored.legacy:
            return stored
    run_dir = out / RUNS_DIR / cell.key
    r = train_cell(cell, rc, log, run_dir)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(r.to_dict(), indent=2) + "\n")
    tmp.replace(f)  # atomic: a killed run leaves no half-written result
    shutil.rmtree(run_dir, ignore_errors=True)  # the result is the run now
    return r


def best_runs(runs: list[RunResult], length: int) -> list[RunResult]:
    """Per cell setting (all but lr and seed), its runs (one per seed) at the lr with the best mean
    *validation* accuracy at ``length`` over the seeds that ran it (ties: fewer mean steps). The test
    rows play no part in the choice."""
    by_lr: dict[tuple[str, int, int, str, float], dict[float, list[RunResult]]] = {}
    for r in runs:
        by_lr.setdefault(r.cell.setting, {}).setdefault(r.cell.lr, []).append(r)

    def score(rs: list[RunResult]) -> tuple[float, float]:
        return sum(r.val_acc(length) for r in rs) / len(rs), -sum(r.steps for r in rs) / len(rs)

    return [r for lrs in by_lr.values() for r in max(lrs.values(), key=score)]


def _run_group(args: tuple[list[Cell], SweepConfig, Path]) -> list[RunResult]:
    """One seed of a cell at every learning rate (Zoology's sweep: the lr is chosen afterwards, on the
    validation rows, by ``best_runs``)."""
    cells, rc, out = args
    runs = []
    for cell in cells:
        t0 = time.perf_counter()
        r = run_cell(cell, rc, out)
        print(f"{cell.key}: {r.steps} steps, test acc {r.accuracy} ({time.perf_counter() - t0:.0f} s)",
              flush=True)  # fmt: skip
        runs.append(r)
    return runs


def stored_runs(rc: SweepConfig, out: Path) -> list[RunResult]:
    """The finished runs of ``rc``'s cells stored under ``out`` (what a report-only pass reads)."""
    files = [out / RUNS_DIR / f"{c.key}.json" for c in rc.cells()]
    return [RunResult.from_dict(json.loads(f.read_text())) for f in files if f.is_file()]


def run_sweep(
    rc: SweepConfig, out: Path, jobs: int = 1, require_sanity: bool = True, train: bool = True
) -> SweepResult:
    """The sanity cell, then every cell at its lrs (``jobs`` at a time), then the report; with
    ``train=False`` only the report, from the runs already stored (a sweep cut short)."""
    out.mkdir(parents=True, exist_ok=True)
    sanity_file = out / RUNS_DIR / f"{rc.sanity.key}.json"
    if not train:
        runs = stored_runs(rc, out)
        sanity = RunResult.from_dict(json.loads(sanity_file.read_text())) if sanity_file.is_file() else None
        return _report(rc, out, runs, sanity)
    rc.save(out / CONFIG_OUT)
    (sanity,) = _run_group(([rc.sanity], rc, out))
    if require_sanity and not sanity.solved:
        print(f"sanity cell {rc.sanity.key} not solved ({sanity.accuracy}): the setup is broken; stopping")
        return SweepResult([], [], [], sanity)
    groups: dict[tuple[str, int, int, str, float, int], list[Cell]] = {}
    for c in rc.cells():
        groups.setdefault(c.group, []).append(c)
    todo = [(cells, rc, out) for cells in groups.values()]
    if jobs > 1:
        with mp.get_context("spawn").Pool(jobs) as pool:
            runs = [r for rs in pool.map(_run_group, todo, chunksize=1) for r in rs]
    else:
        runs = [r for t in todo for r in _run_group(t)]
    return _report(rc, out, runs, sanity)


def _report(rc: SweepConfig, out: Path, runs: list[RunResult], sanity: RunResult | None) -> SweepResult:
    best = best_runs(runs, rc.train_len)
    result = SweepResult(runs, best, expected_checks(rc, best), sanity)
    write_report(result, rc, out)
    return result
