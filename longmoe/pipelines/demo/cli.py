"""``longmoe demo`` (or ``longmoe recipe demo``): tokenizer, curriculum pretraining, eval, MQAR recall
and the report, in one resumable run."""

from __future__ import annotations

import argparse

from longmoe.pipelines.demo.config import DemoConfig
from longmoe.pipelines.demo.run import run_demo
from longmoe.pipelines.recipe import add_common_arguments, config_error

QUICK_SCALE = 0.02  # --quick: the smoke-test budget scale


def add_arguments(p: argparse.ArgumentParser) -> None:
    quick = f"a smoke test (--scale {QUICK_SCALE})"
    add_common_arguments(p, "runs/demo", quick=quick, aliases=("--run-dir",))
    p.add_argument("--scale", type=float, default=None, help="multiply the curriculum's token budgets (1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data order")
    p.add_argument("--resume", action="store_true", help="continue an interrupted demo run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    scale = args.scale if args.scale is not None else (QUICK_SCALE if args.quick else 1.0)
    try:
        cfg = DemoConfig(
            run_dir=args.out, scale=scale, seed=args.seed, resume=args.resume, progress=not args.no_progress
        )
    except ValueError as e:
        raise config_error(e) from e
    run_demo(cfg)
    return 0
