"""``python -m longmoe.pipelines.mqar``: the MQAR sweep (recall vs state capacity, length extrapolation).

Runs the sanity cell first (it must be solved, else the sweep stops: the setup is broken), then every
cell of the config at every learning rate, keeping the lr with the best validation accuracy (the
reported accuracy is on separate test rows); each finished run is stored as
``OUT/runs/<cell>.json`` and a rerun skips it. Writes ``OUT/report.md``, ``OUT/results.json`` and
``OUT/plots/``.

With ``--long`` it runs the long-row stage instead (``long_run``): models trained as sweep cells at the
sweep's length, tested on rows of 4K-64K+ tokens (``OUT/long/``, ``OUT/long_report.md``,
``OUT/long_results.json``; ``--publish`` copies the results and plot into docs/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from longmoe.pipelines.mqar.config import CONFIG_FILE, SweepConfig
from longmoe.pipelines.mqar.long_config import LONG_CONFIG_FILE, LongConfig, Variant
from longmoe.pipelines.mqar.long_report import (
    LONG_RESULTS,
    PUBLISHED_JSON,
    PUBLISHED_PLOT,
    publish,
    write_report,
)
from longmoe.pipelines.mqar.long_run import run_long, stored_records
from longmoe.pipelines.mqar.run import run_sweep
from longmoe.pipelines.recipe import add_common_arguments, config_error, recipe_parser
from longmoe.pipelines.recipe import main as recipe_main
from longmoe.report.provenance import REPO, DirtyTreeError, provenance, require_clean
from longmoe.tasks.mqar import check_settings


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
    g = p.add_argument_group("long rows (--long): short-trained models tested at 4K-64K+ tokens")
    g.add_argument("--long", action="store_true", help="run the long-row stage (long_config.json) instead")
    g.add_argument("--long-config", type=Path, default=LONG_CONFIG_FILE, help="its settings")
    g.add_argument("--lengths", help="comma-separated row lengths, e.g. 4096,16384,65536 (overrides)")
    g.add_argument("--placements", help="comma-separated query placements: near, uniform (overrides)")
    g.add_argument("--variants", help="comma-separated variant names to keep, e.g. LLLM,L (default all)")
    g.add_argument(
        "--publish",
        action="store_true",
        help=f"then copy the results and plot to {PUBLISHED_JSON}, {PUBLISHED_PLOT}",
    )
    g.add_argument("--allow-dirty", action="store_true", help="keep results made from uncommitted code")
    g.add_argument("--note", help="a line kept in the results' provenance (e.g. how busy the machine was)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return recipe_parser("mqar").parse_args(argv)


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",")]


def load_config(args: argparse.Namespace) -> SweepConfig:
    d = SweepConfig.load(args.config).to_dict()
    if args.quick:
        d.update(
            patterns=["LM", "M"],
            pairs=[2],
            lrs=[3e-3],
            positions=["none"],
            seeds=[0],
            steps=30,
            eval_every=10,
            eval_n=16,
            eval_multiples=[1, 4],
            batch_size=8,
            train_len=32,
            vocab_size=64,
            sanity={"pattern": "LM", "d_model": 32, "n_pairs": 2, "position": "none", "lr": 3e-3, "seed": 0},
            d_models=[32],
        )
    for name, conv in (
        ("patterns", lambda s: s.split(",")),
        ("pairs", _ints),
        ("d_models", _ints),
        ("lrs", lambda s: [float(x) for x in s.split(",")]),
        ("seeds", _ints),
    ):
        v = getattr(args, name)
        if v is not None:
            d[name] = conv(v)
    if args.steps is not None:
        d["steps"] = args.steps
    return SweepConfig.from_dict(d)


def load_long_config(args: argparse.Namespace) -> LongConfig:
    """``--long-config`` with the command line's overrides (``--quick``: a seconds-long smoke run)."""
    d = LongConfig.load(args.long_config).to_dict()
    if args.quick:
        d.update(
            n_pairs=4,
            d_model=32,
            seeds=[0],
            lengths=[128, 256],
            rows=[2, 2],
            far_seeds=[0],
            far_lengths=[512],
            far_rows=[1],
            chunk=48,
        )
    if args.variants is not None:
        keep = args.variants.split(",")
        d["variants"] = [v for v in d["variants"] if Variant(**v).name in keep]
        d["far_variants"] = [n for n in d["far_variants"] if n in keep]
    if args.lengths is not None:
        lens = _ints(args.lengths)
        by = dict(zip(d["lengths"], d["rows"]))
        d["lengths"], d["rows"] = lens, [by.get(n, min(d["rows"])) for n in lens]
    if args.placements is not None:
        d["placements"] = args.placements.split(",")
    if args.seeds is not None:
        d["seeds"] = _ints(args.seeds)
    return LongConfig.from_dict(d)


def run_long_stage(args: argparse.Namespace) -> int:
    """Train (or load) and measure every variant x seed, report, and with ``--publish`` copy into docs."""
    started = time.perf_counter()
    try:
        commit = require_clean(args.allow_dirty)
    except DirtyTreeError as e:
        raise config_error(e) from e
    try:
        lc = load_long_config(args)
        sweep = load_config(args).to_dict()  # how every model trains: the sweep's settings (--config)
        rc = SweepConfig.from_dict({**sweep, "eval_multiples": [1], "threads": lc.threads})
        check_settings(rc.vocab_size, rc.train_len, lc.n_pairs, lc.n_pairs, rc.alpha)
    except ValueError as e:  # a TaskError is one
        raise config_error(e) from e
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    records = stored_records(lc, out) if args.report_only else run_long(lc, rc, out)
    argv = sys.argv[sys.argv.index("mqar") + 1 :] if "mqar" in sys.argv else sys.argv[1:]
    prov = provenance(" ".join(["longmoe recipe mqar", *argv]), started, commit)
    prov["note"] = args.note
    old = out / LONG_RESULTS
    if args.report_only and old.is_file():  # the numbers are the measuring run's: keep its record
        prov = {**(json.loads(old.read_text()).get("provenance") or {}), "report_only": prov}
    result = write_report(lc, rc.training_settings(), records, out, prov)
    for c in result["checks"]:
        print(f"{c['verdict']}: {c['claim']} ({c['evidence']})")
    if args.publish:
        for p in publish(out, REPO):
            print(f"wrote {p}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.long:
        return run_long_stage(args)
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
