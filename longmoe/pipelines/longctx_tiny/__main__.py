"""``python -m longmoe.pipelines.longctx_tiny``: train L / M / LLLM at equal size and tokens, eval long."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from longmoe.pipelines.longctx_tiny.config import CONFIG_FILE, RecipeConfig
from longmoe.pipelines.longctx_tiny.run import load_tokenizer, run_recipe
from longmoe.pipelines.recipe import add_common_arguments, config_error, recipe_parser
from longmoe.pipelines.recipe import main as recipe_main
from longmoe.runtime import retain_freed_memory

MODULE = "longmoe.pipelines.longctx_tiny"
QUICK = {"tokens": 8192, "eval_n": 1, "eval_multiples": [1, 2]}  # --quick: a smoke run of the recipe


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, "runs/longctx_tiny", quick=f"a smoke run (overrides {QUICK})")
    p.add_argument(
        "--config", type=Path, default=CONFIG_FILE, help="recipe settings (default: config.json here)"
    )
    p.add_argument("--tokens", type=int, help="training tokens per pattern (overrides the config)")
    p.add_argument("--window", type=int, help="training window in tokens (overrides the config)")
    p.add_argument("--patterns", help="comma-separated layer patterns, e.g. L,M,LLLM (overrides the config)")
    p.add_argument("--eval-n", type=int, help="items per task x length x depth cell (overrides the config)")
    p.add_argument("--eval-multiples", help="eval lengths as multiples of the window, e.g. 1,2,4,8")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="train and evaluate this many patterns at once, one subprocess each with "
        "--threads (default: cores / jobs) threads; tiny models use cores better this way "
        "(on 2 cores, two 1-thread runs do ~1.5x the tokens/s of one 2-thread run)",
    )
    p.add_argument("--skip-eval", action="store_true", help="train only")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return recipe_parser("longctx_tiny").parse_args(argv)


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise config_error(ValueError(f"--jobs={args.jobs}: expected an integer >= 1"))
    if args.quick:  # the smoke sizes, under any explicit override
        for k, v in QUICK.items():
            if getattr(args, k) is None:
                setattr(args, k, ",".join(map(str, v)) if isinstance(v, list) else v)
    retain_freed_memory()  # big logits/gradient blocks reuse heap memory instead of page-faulting
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        rc = RecipeConfig.load(
            args.config,
            tokens=args.tokens,
            window=args.window,
            eval_n=args.eval_n,
            patterns=args.patterns.split(",") if args.patterns else None,
            eval_multiples=[int(x) for x in args.eval_multiples.split(",")] if args.eval_multiples else None,
        )
    except ValueError as e:
        raise config_error(e) from e
    args.out.mkdir(parents=True, exist_ok=True)
    load_tokenizer(rc, args.out)  # once, before the children that share it start
    if args.jobs > 1 and len(rc.patterns) > 1:
        rc_failed = run_parallel(args, rc.patterns)
        if rc_failed:
            return rc_failed
        # every pattern is now trained and evaluated: the run below only loads results and reports
    run_recipe(rc, args.out, progress=not args.no_progress, skip_eval=args.skip_eval)
    return 0


def main(argv: list[str] | None = None) -> int:
    return recipe_main("longctx_tiny", argv)


def pattern_command(args: argparse.Namespace, pattern: str, threads: int) -> list[str]:
    """The command line that runs this recipe for one pattern (what ``--jobs`` starts per pattern)."""
    cmd = [sys.executable, "-m", MODULE, "--config", str(args.config)]
    cmd += ["--out", str(args.out), "--patterns", pattern, "--threads", str(threads), "--no-progress"]
    for name in ("tokens", "window", "eval_n", "eval_multiples"):
        value = getattr(args, name)
        if value is not None:
            cmd += ["--" + name.replace("_", "-"), str(value)]
    if args.skip_eval:
        cmd.append("--skip-eval")
    return cmd


def run_parallel(args: argparse.Namespace, patterns: list[str]) -> int:
    """Run up to ``args.jobs`` patterns at once as subprocesses (logs: ``OUT/log_<pattern>.txt``).

    Each child resumes like a sequential run would, so a killed parallel run restarts where it was.
    Returns 0, or the first non-zero exit status of a child (after the others finish).
    """
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    pending, running, failed = list(patterns), {}, 0
    # a SIGTERM'd parent unwinds through ``finally`` like Ctrl-C does, so children stop with it
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        while pending or running:
            while pending and len(running) < args.jobs:
                p = pending.pop(0)
                log = open(args.out / f"log_{p}.txt", "a")  # noqa: SIM115 (closed when the child ends)
                running[p] = (
                    subprocess.Popen(pattern_command(args, p, threads), stdout=log, stderr=log),
                    log,
                )
                print(f"pattern {p}: started ({threads} threads, log {log.name})")
            time.sleep(0.5)
            for p, (proc, log) in list(running.items()):
                if proc.poll() is not None:
                    log.close()
                    del running[p]
                    print(f"pattern {p}: finished with exit status {proc.returncode}")
                    failed = failed or proc.returncode
    finally:
        for proc, log in running.values():  # interrupted: do not leave orphans training
            proc.terminate()
            proc.wait()
            log.close()
        signal.signal(signal.SIGTERM, previous)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
