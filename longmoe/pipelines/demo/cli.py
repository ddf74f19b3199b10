"""``longmoe demo``: the demo pipeline's command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from longmoe.pipelines.demo.config import DemoConfig
from longmoe.pipelines.demo.run import run_demo


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-dir", type=Path, default=Path("runs/demo"), help="output directory (default runs/demo)"
    )
    p.add_argument("--scale", type=float, default=1.0, help="multiply the curriculum's token budgets")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and data order")
    p.add_argument("--resume", action="store_true", help="continue an interrupted demo run")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        cfg = DemoConfig(
            run_dir=args.run_dir,
            scale=args.scale,
            seed=args.seed,
            resume=args.resume,
            progress=not args.no_progress,
        )
    except ValueError as e:
        print(f"longmoe demo: error: {e}", file=sys.stderr)
        return 2
    run_demo(cfg)
    return 0
