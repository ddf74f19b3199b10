"""``longmoe eval``: three evaluation harnesses, one subcommand each.

    longmoe eval longctx --model runs/train --tasks niah,multihop --lengths 1k,4k     # eval/longctx/
    longmoe eval agent --model runs/sft --envs doclookup,calculator --horizons 1,2,4  # eval/agent/
    longmoe eval extract --model runs/vision_extract/model --families form_easy       # eval/extract/

``longmoe eval --tasks ...`` (no subcommand) keeps working as before: the long-context grid, or
``--tasks agent`` / ``--tasks extract`` alone for the other two harnesses, with every harness's
options on one parser. A bad flag raises a ``UserError`` that ``longmoe`` prints as one line.
"""

from __future__ import annotations

import argparse

from longmoe.eval.agent import cli as agent_cli
from longmoe.eval.errors import EvalError
from longmoe.eval.extract import cli as extract_cli
from longmoe.eval.longctx import cli as longctx_cli
from longmoe.tasks import TASKS

SUBCOMMANDS = {
    "longctx": (
        longctx_cli,
        "long-context task grid (niah, multihop, conflict, recall) and loss by position",
    ),
    "agent": (agent_cli, "tool-using episodes: success by horizon"),
    "extract": (extract_cli, "image -> JSON field extraction on rendered documents"),
}
HARNESS_TASKS = ("agent", "extract")  # `--tasks agent` / `--tasks extract`: another harness, alone

LEGACY_TASKS_HELP = (
    f"comma-separated tasks (default {longctx_cli.DEFAULT_TASKS}; without --ppl-by-position); known: "
    + ", ".join(TASKS)
    + "; or 'agent' alone: tool-using episodes (see the agent options); or 'extract' alone: "
    "image -> JSON on rendered documents (see the extraction options)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "The subcommands are the new way to run an evaluation (`longmoe eval <harness> --help`);\n"
        "the flat form (`longmoe eval --tasks ...`, the options above: every harness's on one\n"
        "parser) keeps working as before."
    )
    sub = p.add_subparsers(dest="harness", metavar="{longctx,agent,extract}")
    for name, (mod, help_) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        mod.add_arguments(sp)
        sp.set_defaults(_harness=mod.run)
    # the flat form: every harness's options on `longmoe eval` itself
    longctx_cli.add_arguments(p, tasks_help=LEGACY_TASKS_HELP)
    agent_cli.add_agent_arguments(p)
    extract_cli.add_extract_arguments(p)


def run(args: argparse.Namespace) -> int:
    harness = getattr(args, "_harness", None)
    if harness is not None:
        return harness(args)
    names = args.tasks.split(",") if args.tasks is not None else []
    for name in HARNESS_TASKS:
        if name in names:
            if args.tasks.strip() != name or args.ppl_by_position:
                raise EvalError(f"--tasks {name} runs alone (no other tasks, no --ppl-by-position)")
            return SUBCOMMANDS[name][0].run(args)
    return longctx_cli.run(args)
