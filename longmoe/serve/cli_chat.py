"""``longmoe chat --model DIR``: an interactive chat REPL using the tokenizer's chat template.

Reads one user message per line from stdin (so it also works piped: ``echo hi | longmoe chat ...``).
Commands: ``/reset`` clears the history, ``/system TEXT`` sets the system message, ``/exit`` quits.
Ctrl-C stops the reply being generated (or clears the prompt line) and keeps the session; Ctrl-D quits.
"""

from __future__ import annotations

import argparse
import sys

from longmoe.serve.cli_generate import add_engine_arguments, add_sampling_arguments, engine_from_args
from longmoe.serve.cli_generate import params_from_args as _params
from longmoe.serve.engine import EngineError
from longmoe.serve.sampling import SamplingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_sampling_arguments(parser, max_tokens=256)
    parser.add_argument("--system", default=None, help="system message placed before the conversation")


def run(args: argparse.Namespace) -> int:
    try:
        params = _params(args)
        engine = engine_from_args(args)
    except (SamplingError, ValueError, FileNotFoundError) as e:
        print(f"longmoe chat: error: {e}", file=sys.stderr)
        return 2
    tty = sys.stdin.isatty()
    system = args.system
    history: list[dict] = []
    if tty:
        print("longmoe chat — /reset clears history, /system TEXT sets the system message, /exit quits")
    with engine:
        while True:
            if tty:
                print("you> ", end="", flush=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt, the session stays
                print()
                continue
            if not line:
                break
            msg = line.rstrip("\n")
            if not msg.strip():
                continue
            if msg.strip() == "/exit":
                break
            if msg.strip() == "/reset":
                history = []
                print("[history cleared]")
                continue
            if msg.startswith("/system"):
                system = msg[len("/system") :].strip() or None
                print(f"[system message {'set' if system else 'cleared'}]")
                continue
            history.append({"role": "user", "content": msg})
            messages = ([{"role": "system", "content": system}] if system else []) + history
            try:
                h = engine.submit(engine.encode_chat(messages), params)
            except EngineError as e:
                history.pop()
                print(f"longmoe chat: error: {e}", file=sys.stderr)
                continue
            print("assistant> ", end="", flush=True)
            try:
                for ev in h.events():
                    if ev.delta:
                        print(ev.delta, end="", flush=True)
            except KeyboardInterrupt:  # Ctrl-C while generating: drop this turn, keep the session
                h.cancel()
                history.pop()
                print("\n[interrupted]")
                continue
            print()
            reply = h.completion.text if h.completion is not None else ""
            history.append({"role": "assistant", "content": reply})
    return 0
