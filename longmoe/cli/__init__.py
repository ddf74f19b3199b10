"""The single entry point: ``longmoe <command>``; this package also holds the package root's own
command (``inspect.py``: ``longmoe inspect``) and the argparse types every command shares (``argtypes.py``).

Each command lives in its own module, which defines ``add_arguments(parser)`` and ``run(args) -> int``.
Modules are imported only when their command is used, so ``longmoe --help`` stays fast (the serving
stack, matplotlib and the trainer are not loaded to print a help line).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from longmoe import __version__
from longmoe.errors import UserError
from longmoe.runtime import retain_freed_memory

EXIT_USAGE = 2  # a user error: bad flag, file or config (argparse uses the same status)
EXIT_BROKEN_PIPE = 1  # stdout closed early (`longmoe inspect | head`), as Python itself exits
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, the shell convention

# name -> (module path, one-line help). Add a command by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "version": ("longmoe.cli", "print the longmoe version"),
    "inspect": ("longmoe.cli.inspect", "parameter, sparsity and cache-memory accounting for a config"),
    "train": ("longmoe.train.cli", "pretrain a model through a context curriculum"),
    "sft": ("longmoe.train.sft_cli", "fine-tune a pretrained run on expert tool-use demonstrations"),
    "plot": ("longmoe.train.plots", "render loss/balance plots for a training run directory"),
    "demo": (
        "longmoe.pipelines.demo.cli",
        "end-to-end demo: tokenizer, curriculum pretraining, eval, report",
    ),
    "recipe": ("longmoe.pipelines.recipe", "run a recipe (end-to-end pipeline): longmoe recipe --list"),
    "generate": ("longmoe.serve.cli.generate", "generate text from a prompt, streamed to the terminal"),
    "chat": ("longmoe.serve.cli.chat", "interactive chat REPL using the tokenizer's chat template"),
    "serve": ("longmoe.serve.cli.serve", "OpenAI-compatible HTTP server"),
    "eval": ("longmoe.eval.cli", "evaluation: long-context tasks and ppl, agent episodes, extraction"),
    "rl": ("longmoe.rl.cli", "agentic RL (rollouts through the engine, GiGPO-style advantages, PPO + KL)"),
    "convert": ("longmoe.interop.cli", "convert transformers Kimi-Linear checkpoints to longmoe and back"),
    "report": ("longmoe.report.card", "one report card (report.md) from every committed result JSON"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:  # the `version` command
    del parser


def run(args: argparse.Namespace) -> int:  # the `version` command
    print(f"longmoe {__version__}")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longmoe",
        description="longmoe: train, serve and evaluate a hybrid linear-attention sparse MoE LM.",
    )
    parser.add_argument("--version", action="version", version=f"longmoe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (mod, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if name == command:  # only import the module of the command being run
            m = importlib.import_module(mod)
            m.add_arguments(p)
            p.set_defaults(_run=m.run)
    return parser


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at devnull so the interpreter's final flush cannot raise again
    (the recipe in Python's ``signal`` documentation, "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (captured in tests): nothing to do
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status.

    One error style for every command: a ``UserError`` (or an ``OSError`` such as a missing or
    unwritable file) prints ``longmoe <command>: error: <message>`` on stderr and returns 2; Ctrl-C
    returns 130 and a closed stdout returns 1, both without a traceback. Any other exception is a bug
    and propagates with its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    retain_freed_memory()  # large CPU tensors reuse heap memory instead of page-faulting each step
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(command)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help, --version, or a usage error argparse already printed
            return e.code if isinstance(e.code, int) else EXIT_USAGE
        if not getattr(args, "_run", None):
            parser.print_help()
            return 0 if args.command is None else EXIT_USAGE
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # a broken pipe surfaces here, inside the handler, not at interpreter exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(file=sys.stderr)  # end the line the ^C was echoed on
        return EXIT_INTERRUPTED
    except (UserError, OSError) as e:
        message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())  # one line
        print(f"longmoe {command}: error: {message or type(e).__name__}", file=sys.stderr)
        return EXIT_USAGE
