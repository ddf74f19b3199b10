"""``--jobs N``: the recipe's RL runs, N at a time, each in its own process with ``threads // N`` threads.

The RL runs of the recipe are independent once their learning rate is known: the ``rl_lrs``
candidates at the first seed, then ``rl_seeds - 1`` more seeds and the ablations at the chosen lr.
A run's tiny model parallelises poorly across threads, so N one-thread runs finish sooner than N
two-thread runs in a row. The lr choice is a barrier, which would leave workers idle while the last
candidate trains; instead a free worker starts the next run at the **best lr so far** (on the same
validation scores ``choose_rl_lr`` uses), and once every candidate is scored a run started at a
superseded lr is stopped or discarded and redone at the chosen one. Nothing else changes: each worker
calls the recipe's own ``rl`` and ``evaluate``, writes the same directories, and evaluations (read-
modify-write of ``RUN/evals.json``) are serialised by a file lock. Test evaluations wait for the lr
to be settled, so a model is never scored under a name whose lr is not the chosen one. Afterwards the
sequential recipe finds every run done and only fills in what is missing (its seed-0 test evaluation).
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from longmoe import checkpoint as ckpt
from longmoe.pipelines.agent import run as recipe
from longmoe.pipelines.agent.config import ABLATIONS, AgentRecipeConfig
from longmoe.pipelines.agent.report import pooled

LOCK = "evals.lock"


@dataclass(frozen=True)
class Job:
    """One RL run: ``lr`` None = at the chosen lr (not yet known when the job was queued)."""

    lr: float | None
    seed: int
    ablation: str | None = None


@dataclass(frozen=True)
class Started:
    """A job given a concrete lr; ``provisional`` when that lr was only the best so far."""

    job: Job
    lr: float
    provisional: bool


def validation_scores(cfg: AgentRecipeConfig, root: Path) -> dict[float, float]:
    """lr -> pooled validation success of the candidates scored so far (``choose_rl_lr``'s numbers)."""
    path = root / recipe.VAL_EVALS
    done = json.loads(path.read_text()) if path.exists() else {}
    rows = {lr: done.get(f"sft+rl@lr{lr:g}") for lr in cfg.rl_lrs}
    return {lr: pooled(r)[0] for lr, r in rows.items() if r}


def best_lr(cfg: AgentRecipeConfig, scores: dict[float, float]) -> float | None:
    """The lr to run at: the only candidate, else the best-scored so far (ties to the earlier
    candidate, as ``choose_rl_lr``'s ``max``); None while nothing is scored."""
    if len(cfg.rl_lrs) == 1:
        return cfg.rl_lrs[0]
    scored = [lr for lr in cfg.rl_lrs if lr in scores]
    return max(scored, key=lambda lr: scores[lr]) if scored else None


def settled(cfg: AgentRecipeConfig, scores: dict[float, float]) -> bool:
    """Whether ``best_lr`` is final: a single candidate, or every candidate scored."""
    return len(cfg.rl_lrs) == 1 or all(lr in scores for lr in cfg.rl_lrs)


@dataclass
class Scheduler:
    """Which RL runs to start, and which to redo, given the validation scores so far (pure logic)."""

    cfg: AgentRecipeConfig
    pending: list[Job] = field(init=False)  # the queue: lr candidates, the other seeds, the ablations

    def __post_init__(self) -> None:
        c = self.cfg
        self.pending = [Job(lr, 0) for lr in (c.rl_lrs if len(c.rl_lrs) > 1 else [])]
        self.pending += [Job(None, s) for s in range(0 if len(c.rl_lrs) == 1 else 1, c.rl_seeds)]
        self.pending += [Job(None, s, a) for a in c.ablations for s in range(c.ablation_seeds)]

    def start(self, free: int, scores: dict[float, float]) -> list[Started]:
        """Up to ``free`` jobs to start now, in queue order; a job at the chosen lr waits until some
        candidate is scored, then starts at the best lr so far."""
        out = []
        while len(out) < free and self.pending:
            job = self.pending[0]
            lr = job.lr if job.lr is not None else best_lr(self.cfg, scores)
            if lr is None:
                break
            self.pending.pop(0)
            out.append(Started(job, lr, job.lr is None and not settled(self.cfg, scores)))
        return out

    def superseded(self, started: list[Started], scores: dict[float, float]) -> list[Started]:
        """Once the lr is settled: the provisional runs at another lr, requeued at the front."""
        if not settled(self.cfg, scores):
            return []
        lr = best_lr(self.cfg, scores)
        bad = [s for s in started if s.provisional and s.lr != lr]
        self.pending[:0] = [s.job for s in bad]
        return bad


def _worker(run_dir: str, lr: float, seed: int, ablation: str | None, threads: int, log: str) -> None:
    """One RL run of the recipe in this process, then its evaluations (under the lock)."""
    torch.set_num_threads(threads)
    sys.stdout = sys.stderr = open(log, "a", buffering=1)  # noqa: SIM115 (the process's own log)
    root = Path(run_dir)
    cfg = AgentRecipeConfig.load(root / recipe.RECIPE_CONFIG)
    changes = {**(ABLATIONS[ablation] if ablation else {}), "lr": lr, "seed": cfg.seed + seed}
    name = recipe.rl_run_name(lr, seed, ablation)
    path = recipe.rl(cfg, root, root / "sft" / ckpt.FINAL_DIR, name, changes)
    with open(root / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if len(cfg.rl_lrs) > 1 and ablation is None and seed == 0:  # an lr candidate: its validation score
            recipe.evaluate(cfg, root, f"sft+rl@lr{lr:g}", path, cfg.val_episodes, validation=True)
        scores = validation_scores(cfg, root)
        if settled(cfg, scores) and best_lr(cfg, scores) == lr:  # test evals only under the chosen lr
            eps = cfg.ablation_eval_episodes if ablation else cfg.eval_episodes
            recipe.evaluate(cfg, root, recipe.rl_model_name(seed, ablation), path, eps)


def run_parallel(cfg: AgentRecipeConfig, root: Path, jobs: int, poll_s: float = 10.0) -> None:
    """Every RL run of the recipe (and the evaluations each can do), ``jobs`` processes at a time."""
    threads = max(1, torch.get_num_threads() // jobs)
    sched = Scheduler(cfg)
    ctx = mp.get_context("spawn")
    running: dict[Started, mp.Process] = {}
    finished: list[Started] = []
    while sched.pending or running:
        for s, proc in list(running.items()):
            if not proc.is_alive():
                del running[s]
                if proc.exitcode:
                    for p in running.values():
                        p.kill()
                    code = proc.exitcode
                    raise RuntimeError(f"RL worker {s.job} (lr {s.lr:g}) failed with exit code {code}")
                finished.append(s)
        scores = validation_scores(cfg, root)
        for s in sched.superseded(finished + list(running), scores):
            recipe.say(f"redo {s.job} at the chosen lr (ran at {s.lr:g}, the best so far)")
            if s in running:
                running.pop(s).kill()
            else:
                finished.remove(s)
        for s in sched.start(jobs - len(running), scores):
            name = recipe.rl_run_name(s.lr, s.job.seed, s.job.ablation)
            recipe.say(f"worker: RL run {name}{' (lr: best so far)' if s.provisional else ''}")
            args = (str(root), s.lr, s.job.seed, s.job.ablation, threads, str(root / f"{name}.log"))
            running[s] = proc = ctx.Process(target=_worker, args=args)
            proc.start()
        time.sleep(poll_s)
