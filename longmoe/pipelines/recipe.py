"""``longmoe recipe <name> [--quick] [--out DIR] [options]``: one way to run every pipeline.

A recipe module (``RECIPES``: name -> module) defines ``add_arguments(parser)`` and ``run(args) -> int``
like a ``longmoe`` command; what every recipe repeats lives here: the ``--quick`` / ``--out`` flags
(``add_common_arguments``), the config error (``RecipeError``, printed as one line by ``longmoe``), the
``python -m longmoe.pipelines.<name>`` alias (``main``) and, after a successful run, the run's provenance
(commit, date, machine, threads, command, wall time) in ``OUT/provenance.json``.
Plots go through ``longmoe.report.plotting.pyplot()``; no recipe sets a matplotlib backend at import.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from longmoe.errors import UserError
from longmoe.report.provenance import provenance

PROVENANCE_FILE = "provenance.json"  # written into a recipe's --out after a successful run

# name -> (module with add_arguments / run, one-line help). Add a recipe by adding a line here.
RECIPES: dict[str, tuple[str, str]] = {
    "demo": ("longmoe.pipelines.demo.cli", "tokenizer, curriculum pretraining, eval, MQAR recall, report"),
    "longctx_tiny": ("longmoe.pipelines.longctx_tiny.__main__", "L / M / LLLM trained short, tested long"),
    "ablations": ("longmoe.pipelines.ablations.__main__", "decay bounds, attention residuals, balancers"),
    "mqar": ("longmoe.pipelines.mqar.__main__", "associative recall vs state capacity, length extrapolation"),
    "agent": ("longmoe.pipelines.agent.__main__", "pretrain -> SFT -> RL on the tool environments"),
    "agent-long": (
        "longmoe.pipelines.agent_long.__main__",
        "long horizons: lengths, rollouts, RL credit arms",
    ),
    "vision_extract": ("longmoe.pipelines.vision_extract.__main__", "image -> JSON extraction, text control"),
}


class RecipeError(UserError, ValueError):
    """A recipe name, flag or config the user can fix (one line on the CLI, exit status 2)."""


def add_common_arguments(
    p: argparse.ArgumentParser,
    out: str | None,
    quick: str = "a smoke run in seconds",
    aliases: tuple[str, ...] = (),
    out_help: str | None = None,
) -> None:
    """``--quick`` and ``--out DIR`` (default ``out``; ``aliases`` such as ``--run-dir`` also work)."""
    p.add_argument(
        "--out",
        *aliases,
        dest="out",
        type=Path,
        default=None if out is None else Path(out),
        help=out_help or f"output directory (default {out})",
    )
    p.add_argument("--quick", action="store_true", help=quick)


def config_error(e: Exception) -> RecipeError:
    """A config's validation error (``ValueError``, ``TypeError``, a missing file) as a ``RecipeError``."""
    return RecipeError(str(e))


def recipe_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``longmoe recipe NAME``; raises ``RecipeError`` for an unknown name."""
    if name not in RECIPES:
        known = ", ".join(RECIPES)
        raise RecipeError(f"unknown recipe {name!r}: expected one of {known} (longmoe recipe --list)")
    mod, help_ = RECIPES[name]
    m = importlib.import_module(mod)
    p = argparse.ArgumentParser(prog=f"longmoe recipe {name}", description=(m.__doc__ or help_).strip())
    m.add_arguments(p)
    p.set_defaults(_run=m.run)
    return p


def main(name: str, argv: list[str] | None = None) -> int:
    """``python -m longmoe.pipelines.NAME ARGS``: the same as ``longmoe recipe NAME ARGS``."""
    from longmoe.cli import main as cli_main

    return cli_main(["recipe", name, *(sys.argv[1:] if argv is None else argv)])


# ------------------------------------------------------------------ the `longmoe recipe` command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--list", action="store_true", help="name every recipe with a line on what it runs")
    p.add_argument("name", nargs="?", metavar="<recipe>", help=f"one of {', '.join(RECIPES)}")
    p.add_argument(
        "options", nargs=argparse.REMAINDER, help="the recipe's own options (longmoe recipe <recipe> --help)"
    )


def run(args: argparse.Namespace) -> int:
    if args.list:
        width = max(map(len, RECIPES))
        for name, (_, help_) in RECIPES.items():
            print(f"{name:<{width}}  {help_}")
        return 0
    if args.name is None:
        raise RecipeError(f"give a recipe: one of {', '.join(RECIPES)} (longmoe recipe --list)")
    p = recipe_parser(args.name)
    try:
        rargs = p.parse_args(args.options)
    except SystemExit as e:  # --help, or a usage error argparse already printed
        return e.code if isinstance(e.code, int) else 2
    started = time.perf_counter()
    rc = int(rargs._run(rargs) or 0)
    out = getattr(rargs, "out", None)
    if rc == 0 and out is not None and Path(out).is_dir():  # what `longmoe report` prints beside the numbers
        command = " ".join(["longmoe recipe", args.name, *args.options])
        (Path(out) / PROVENANCE_FILE).write_text(json.dumps(provenance(command, started), indent=2) + "\n")
    return rc
