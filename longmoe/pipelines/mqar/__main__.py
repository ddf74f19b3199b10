"""``python -m longmoe.pipelines.mqar``: the MQAR sweep (recall vs state capacity, length extrapolation).

Runs the sanity cell first (it must be solved, else the sweep stops: the setup is broken), then every
cell of the config at every learning rate, keeping the lr with the best validation accuracy (the
reported accuracy is on separate test rows); each finished run is stored as
``OUT/runs/<cell>.json`` and a rerun skips it. Writes ``OUT/report.md``, ``OUT/results.json`` and
``OUT/plots/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from longmoe.pipelines.mqar.config import CONFIG_FILE, SweepConfig
from longmoe.pipelines.mqar.run import run_sweep
from longmoe.pipelines.recipe import add_common_arguments, config_error, recipe_parser
from longmoe.pipelines.recipe import main as recipe_main


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, "runs/mqar", quick="a smoke run: 2 patterns, 1 lr, 1 seed, 30 steps")
    p.add_argument(
        "--config", type=Path, default=CONFIG_FILE, help="sweep settings (default: config.json here)"
    )
    p.add_argument(
        "--patterns", help="comma-separated layer patterns, e.g. L,M,LLLM,LM (overrides the config)"
    )
    p.add_argument("--pairs", help="comma-separated pair counts, e.g. 4,16,32 (overrides the config)")
    p.add_argument("--d-models", help="comma-separated widths, e.g. 64,128 (overrides the config)")
    p.add_argument("--lrs", help="comma-separated learning rates (overrides the config)")
    p.add_argument("--seeds", help="comma-separated seeds (overrides the config)")
    p.add_argument("--steps", type=int, help="step budget per run (overrides the config)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, one process each (default 1)")
    p.add_argument("--report-only", action="store_true", help="no training: report the runs stored so far")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return recipe_parser("mqar").parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",")]


def load_config(args: argparse.Namespace) -> SweepConfig:
    d = SweepConfig.load(args.config).to_dict()
    if args.quick:
        d.update(patterns=["LM", "M"], pairs=[2], lrs=[3e-3], positions=["none"], seeds=[0], steps=30,
                 eval_every=10, eval_n=16, eval_multiples=[1, 4], batch_size=8, train_len=32, vocab_size=64,
                 sanity={"pattern": "LM", "d_model": 32, "n_pairs": 2, "position": "none", "lr": 3e-3,
                         "seed": 0},
                 d_models=[32])  # fmt: skip
    for name, conv in (("patterns", lambda s: s.split(",")), ("pairs", _ints), ("d_models", _ints),
                       ("lrs", lambda s: [float(x) for x in s.split(",")]), ("seeds", _ints)):  # fmt: skip
        v = getattr(args, name)
        if v is not None:
            d[name] = conv(v)
    if args.steps is not None:
        d["steps"] = args.steps
    return SweepConfig.from_dict(d)


def run(args: argparse.Namespace) -> int:
    try:
        rc = load_config(args)
    except ValueError as e:
        raise config_error(e) from e
    result = run_sweep(
        rc, args.out, jobs=max(1, args.jobs), require_sanity=not args.quick, train=not args.report_only
    )
    if args.report_only:
        return 0
    return 0 if result.sanity is not None and (result.sanity.solved or args.quick) else 1


def main(argv: list[str] | None = None) -> int:
    return recipe_main("mqar", argv)


if __name__ == "__main__":
    raise SystemExit(main())
