"""``longmoe chat --model DIR``: an interactive chat REPL using the tokenizer's chat template.

Reads one user message per line from stdin (so it also works piped: ``echo hi | longmoe chat ...``).
Commands: ``/reset`` clears the history, ``/system TEXT`` sets the system message, ``/exit`` quits,
``/image PATH`` attaches an image (PNG, JPEG, WebP, GIF) to the next message (a model with a vision
encoder; ``--image FILE`` attaches one to the first message). An attached image is shown to the model
before the message's text and stays in the history.
Ctrl-C stops the reply being generated (or clears the prompt line) and keeps the session; Ctrl-D quits.

With ``--tools FILE`` (a JSON list of OpenAI function schemas) the model sees the tools and may call
them: a call is shown as ``-> name({arguments})`` (text before it streams as usual, the call itself is
shown once complete), then each call's result is read as the next line (prompt ``tool[name]>``) and
the model continues. ``--tool-choice required`` forces a valid call (grammar-constrained) as the first
turn after each user message; ``none`` forbids calls.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longmoe.data.chat import TOOL_CALL, parse_assistant
from longmoe.layers.vision import Patches
from longmoe.serve.cli.options import add_engine_arguments, add_sampling_arguments, engine_from_args
from longmoe.serve.cli.options import params_from_args as _params
from longmoe.serve.engine import Engine
from longmoe.serve.errors import EngineError
from longmoe.serve.images import ImageInputError, file_patches
from longmoe.serve.sampling import SamplingError, TokenConstraint
from longmoe.serve.structured import JsonGrammars, StructuredOutputError
from longmoe.serve.tool_calls import forced_call, no_call

PATCHES = "_patches"  # key of a history message's attached images (stripped before rendering)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    add_sampling_arguments(parser, max_tokens=256)
    parser.add_argument("--system", default=None, help="system message placed before the conversation")
    parser.add_argument(
        "--image", action="append", default=[], metavar="FILE",
        help="attach an image to the first message (repeatable; /image PATH attaches one later)",
    )  # fmt: skip
    parser.add_argument(
        "--tools", type=Path, default=None, help="JSON file: a list of OpenAI tools the model may call"
    )
    parser.add_argument(
        "--tool-choice",
        choices=["auto", "required", "none"],
        default="auto",
        help="with --tools: auto (the model decides), required (a call first after each user message), "
        "none (no calls)",
    )


def load_tools(path: Path) -> list[dict[str, Any]]:
    """A JSON list of tools (``{"type": "function", "function": {...}}`` or bare function objects)."""
    tools = json.loads(path.read_text())
    ok = isinstance(tools, list) and all(
        isinstance(t, dict) and isinstance(t.get("function", t).get("name"), str) for t in tools
    )
    if not ok:
        raise ValueError(f"--tools {path}: expected a JSON list of function schemas, each with a 'name'")
    return tools


def _constraints(
    engine: Engine, tools: list[dict[str, Any]], choice: str
) -> tuple[Callable[[], TokenConstraint] | None, Callable[[], TokenConstraint] | None]:
    """The constraints of the first turn after a user message and of the turns after tool results."""
    if not tools:
        return None, None
    call = engine.tokenizer.token_to_id(TOOL_CALL)
    if choice == "none":
        return no_call(call), no_call(call)
    if choice == "required":
        return forced_call(JsonGrammars(engine.tokenizer, engine.vocab_size), call, tools), None
    return None, None


def _show_call(name: str, arguments: dict[str, Any]) -> str:
    return f"  -> {name}({json.dumps(arguments, ensure_ascii=False)})"


def _user_message(text: str, images: list[Patches]) -> dict[str, Any]:
    """A user message: the attached images (as image parts, their ``Patches`` kept beside), then text."""
    if not images:
        return {"role": "user", "content": text}
    parts = [{"type": "image_url", "image_url": {"url": "attached"}} for _ in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}], PATCHES: images}


def _prompt(
    engine: Engine, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[list[int], list[Patches]]:
    images = [p for m in messages for p in m.get(PATCHES, [])]
    clean = [{k: v for k, v in m.items() if k != PATCHES} for m in messages]
    return engine.encode_chat(clean, tools or None, images), images


def run(args: argparse.Namespace) -> int:
    try:
        params = _params(args)
        tools = load_tools(args.tools) if args.tools else []
        engine = engine_from_args(args)
        first, later = _constraints(engine, tools, args.tool_choice)
        limits, vision = engine.cfg.image_limits, engine.model.cfg.vision
        attached = file_patches(args.image, limits, vision, "--image")
    except (SamplingError, StructuredOutputError, ImageInputError, ValueError, FileNotFoundError) as e:
        print(f"longmoe chat: error: {e}", file=sys.stderr)
        return 2
    tty = sys.stdin.isatty()
    system = args.system
    history: list[dict] = []
    pending: list[dict] = []  # tool calls of the last turn still waiting for their results
    call_tok = engine.tokenizer.token_to_id(TOOL_CALL)
    if tty:
        print(
            "longmoe chat — /reset clears history, /system TEXT sets the system message, "
            "/image PATH attaches an image, /exit quits"
        )
    with engine:
        while True:
            if tty:
                print(f"tool[{pending[0]['function']['name']}]> " if pending else "you> ", end="", flush=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:  # Ctrl-C at the prompt: a fresh prompt, the session stays
                print()
                continue
            if not line:
                break
            msg = line.rstrip("\n")
            if pending:  # the line is the result of the next pending call
                history.append({"role": "tool", "tool_call_id": pending.pop(0)["id"], "content": msg})
                if pending:
                    continue
                constraint = later
            else:
                if not msg.strip():
                    continue
                if msg.strip() == "/exit":
                    break
                if msg.strip() == "/reset":
                    history, attached = [], []
                    print("[history cleared]")
                    continue
                if msg.startswith("/system"):
                    system = msg[len("/system") :].strip() or None
                    print(f"[system message {'set' if system else 'cleared'}]")
                    continue
                if msg.startswith("/image"):
                    path = msg[len("/image") :].strip()
                    try:
                        attached += file_patches([path], limits, vision, "/image")
                    except ImageInputError as e:
                        print(f"longmoe chat: error: {e}", file=sys.stderr)
                        continue
                    print(f"[image attached to the next message: {len(attached)} in all]")
                    continue
                history.append(_user_message(msg, attached))
                constraint = first
            messages = ([{"role": "system", "content": system}] if system else []) + history
            p = dataclasses.replace(params, constraint=constraint) if constraint else params
            try:
                ids, images = _prompt(engine, messages, tools)
                h = engine.submit(ids, p, images=images)
            except EngineError as e:
                history.pop()
                print(f"longmoe chat: error: {e}", file=sys.stderr)
                continue
            attached = []
            print("assistant> ", end="", flush=True)
            in_call = False
            try:
                for ev in h.events():
                    in_call = in_call or (tools and call_tok in ev.token_ids)
                    if ev.delta and not in_call:
                        print(ev.delta, end="", flush=True)
            except KeyboardInterrupt:  # Ctrl-C while generating: drop this turn, keep the session
                h.cancel()
                history.pop()
                print("\n[interrupted]")
                continue
            print()
            c = h.completion
            turn = (
                parse_assistant(engine.tokenizer.decode(c.token_ids, skip_special_tokens=False))
                if c
                else None
            )
            if tools and turn is not None and turn.tool_calls and turn.malformed is None:
                for tc in turn.tool_calls:
                    print(_show_call(tc.name, tc.arguments))
                calls = [tc.to_openai(f"call_{len(history)}_{i}") for i, tc in enumerate(turn.tool_calls)]
                history.append({"role": "assistant", "content": turn.content, "tool_calls": calls})
                pending = list(calls)
                continue
            if in_call and turn is not None:  # a malformed call: show what was written
                print(f"  [malformed tool call: {turn.malformed}]")
            history.append({"role": "assistant", "content": c.text if c is not None else ""})
    return 0
