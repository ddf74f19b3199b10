"""``python -m longmoe.pipelines.ablations``: bounded vs unbounded decay, attention vs plain residuals,
and the MoE balancers, trained at tiny scale over seeds; resumable, one JSON file per finished run."""

from __future__ import annotations

import argparse

import torch

from longmoe.pipelines.ablations.config import STUDIES, AblationConfig
from longmoe.pipelines.ablations.report import REPORT_MD
from longmoe.pipelines.ablations.run import run_ablations
from longmoe.pipelines.recipe import add_common_arguments, config_error, recipe_parser
from longmoe.pipelines.recipe import main as recipe_main
from longmoe.runtime import retain_freed_memory


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, "runs/ablations", quick="a smoke run in seconds (a few steps, one seed)")
    p.add_argument(
        "--studies", default=",".join(STUDIES), help=f"comma-separated subset of {','.join(STUDIES)}"
    )
    p.add_argument("--arms", help="comma-separated arms of those studies to run (default: all)")
    p.add_argument("--seeds", type=int, help="seeds per study (overrides every study's default)")
    p.add_argument("--steps", type=int, help="optimizer steps per run (overrides every study's default)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--no-report", action="store_true", help="train only (e.g. one study per process)")
    p.add_argument("--progress", action="store_true", help="progress bars")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return recipe_parser("ablations").parse_args(argv)


def config_from_args(args: argparse.Namespace) -> AblationConfig:
    over: dict[str, object] = {"studies": tuple(s for s in args.studies.split(",") if s)}
    if args.arms:
        over["arms"] = tuple(a for a in args.arms.split(",") if a)
    for study in STUDIES:
        if args.seeds is not None:
            over[f"{study}_seeds"] = args.seeds
        if args.steps is not None:
            over[f"{study}_steps"] = args.steps
    return AblationConfig.quick(**over) if args.quick else AblationConfig(**over)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except (ValueError, TypeError) as e:
        raise config_error(e) from e
    retain_freed_memory()
    torch.set_num_threads(args.threads)
    run_ablations(cfg, args.out, progress=args.progress, report=not args.no_report)
    if not args.no_report:
        print(f"wrote {args.out / REPORT_MD}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return recipe_main("ablations", argv)


if __name__ == "__main__":
    raise SystemExit(main())
