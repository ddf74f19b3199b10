"""``longmoe recipe agent [--quick] [--out DIR]`` (or ``python -m longmoe.pipelines.agent``): run (or
resume) the agent recipe: pretrain -> SFT -> RL, held-out success by horizon, report."""

from __future__ import annotations

import argparse
import logging

from longmoe.cli.argtypes import positive_int
from longmoe.pipelines.agent.config import AgentRecipeConfig
from longmoe.pipelines.agent.parallel import run_parallel
from longmoe.pipelines.agent.run import report_so_far, run_recipe
from longmoe.pipelines.recipe import add_common_arguments, config_error
from longmoe.pipelines.recipe import main as recipe_main


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        None,
        quick="a smoke test of every stage (about two minutes)",
        aliases=("--run-dir",),
        out_help="output directory (default runs/agent, runs/agent-quick with --quick)",
    )
    p.add_argument(
        "--jobs",
        type=positive_int,
        default=1,
        help="RL runs trained at once, each in its own process with threads/JOBS threads (default 1: in "
        "turn); a free worker starts the next run at the best validated lr so far and redoes it if "
        "the last candidate wins (longmoe/pipelines/agent/parallel.py)",
    )
    p.add_argument(
        "--report-only", action="store_true", help="write the report from the evaluations done so far"
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        cfg = AgentRecipeConfig.quick() if args.quick else AgentRecipeConfig()
    except ValueError as e:
        raise config_error(e) from e
    if args.out is not None:
        cfg.run_dir = str(args.out)
    if args.report_only:
        report_so_far(cfg)
    else:
        jobs = args.jobs
        run_recipe(cfg, None if jobs == 1 else lambda c, root: run_parallel(c, root, jobs))
    return 0


def main(argv: list[str] | None = None) -> int:
    return recipe_main("agent", argv)


if __name__ == "__main__":
    raise SystemExit(main())
