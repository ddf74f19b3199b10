"""``longmoe recipe agent-long [--quick] [--out DIR]`` (or ``python -m longmoe.pipelines.agent_long``):
the long-horizon suite's trajectory lengths, rollout throughput at horizon 32 with and without
sessions, and the credit-assignment arms (outcome-only, GiGPO, GiGPO without KL, curriculum) at
horizons 8 and 16; ``RUN/report.md``."""

from __future__ import annotations

import argparse
import logging

from longmoe.cli.argtypes import positive_int
from longmoe.pipelines.agent_long.config import ARMS, AgentLongConfig
from longmoe.pipelines.agent_long.run import run_recipe
from longmoe.pipelines.recipe import add_common_arguments, config_error
from longmoe.pipelines.recipe import main as recipe_main


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(
        p,
        None,
        quick="every stage at smoke-test size (minutes): shows the arms run; its numbers mean nothing",
        aliases=("--run-dir",),
        out_help="output directory (default runs/agent-long, runs/agent-long-quick with --quick)",
    )
    p.add_argument("--arms", default=None, help=f"RL arms, comma-separated (default all: {','.join(ARMS)})")
    p.add_argument(
        "--seeds", type=positive_int, default=None, help="RL seeds per arm (default 3; 1 with --quick)"
    )
    p.add_argument("--no-curriculum", action="store_true", help="skip the horizon-curriculum arm")
    p.add_argument("--no-bench", action="store_true", help="skip bench/rollout_long.py")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        cfg = AgentLongConfig.quick() if args.quick else AgentLongConfig()
        if args.arms is not None:
            cfg.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        if args.seeds is not None:
            cfg.rl_seeds = args.seeds
        cfg.curriculum = cfg.curriculum and not args.no_curriculum
        cfg.bench = cfg.bench and not args.no_bench
        cfg.__post_init__()
    except ValueError as e:
        raise config_error(e) from e
    if args.out is not None:
        cfg.run_dir = str(args.out)
    report = run_recipe(cfg, quick=args.quick)
    print(f"[agent-long] verdict: {report['verdict']}; report in {cfg.run_dir}/report.md")
    return 0


def main(argv: list[str] | None = None) -> int:
    return recipe_main("agent-long", argv)


if __name__ == "__main__":
    raise SystemExit(main())
