"""``python -m longmoe.pipelines.agent [--quick] [--run-dir DIR]``: run (or resume) the agent recipe."""

from __future__ import annotations

import argparse
import logging

from longmoe.pipelines.agent.config import AgentRecipeConfig
from longmoe.pipelines.agent.run import report_so_far, run_recipe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a smoke test of every stage (about two minutes)")
    ap.add_argument("--run-dir", help="output directory (default runs/agent, runs/agent-quick with --quick)")
    ap.add_argument(
        "--report-only", action="store_true", help="write the report from the evaluations done so far"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    cfg = AgentRecipeConfig.quick() if args.quick else AgentRecipeConfig()
    if args.run_dir:
        cfg.run_dir = args.run_dir
    if args.report_only:
        report_so_far(cfg)
    else:
        run_recipe(cfg)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
