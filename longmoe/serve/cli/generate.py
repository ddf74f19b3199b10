"""``longmoe generate --model DIR "prompt"``: stream a completion to the terminal.

``--image FILE`` (repeatable, a model with a vision encoder) puts each image's token span before the
prompt text, in the order given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from longmoe.serve.cli.options import (
    add_engine_arguments,
    add_sampling_arguments,
    engine_from_args,
    params_from_args,
)
from longmoe.serve.compiled import announce
from longmoe.serve.engine import Engine
from longmoe.serve.errors import EngineError
from longmoe.serve.images import ImageInputError, file_patches
from longmoe.serve.sampling import SamplingError, TokenConstraint
from longmoe.serve.structured import JsonFormat, JsonGrammars, StructuredOutputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("prompt", nargs="?", default="-", help='prompt text ("-" or omitted: read stdin)')
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="FILE",
        help="an image (PNG, JPEG, WebP, GIF) placed before the prompt text; repeatable (vision models)",
    )
    add_sampling_arguments(parser)
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-text token")
    parser.add_argument("--stats", action="store_true", help="print token counts and speed to stderr")
    parser.add_argument(
        "--json-schema",
        metavar="FILE",
        help="constrain the output to JSON matching this JSON Schema file ('{}' file: any JSON object)",
    )


def json_constraint(engine: Engine, path: str) -> Callable[[], TokenConstraint]:
    """The ``--json-schema FILE`` constraint; ``StructuredOutputError`` for a file that is not a schema."""
    try:
        schema = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StructuredOutputError(f"cannot read {path}: {e}", "--json-schema") from None
    if not isinstance(schema, dict):
        raise StructuredOutputError("the schema must be a JSON object", "--json-schema")
    grammars = JsonGrammars(engine.tokenizer, engine.vocab_size)
    try:
        return grammars.constraint(JsonFormat(schema or None))
    except StructuredOutputError as e:
        raise StructuredOutputError(str(e).split(": ", 1)[1], "--json-schema") from None


def run(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        params = params_from_args(args, ignore_eos=args.ignore_eos)
        engine = engine_from_args(args)
    except (SamplingError, ValueError, FileNotFoundError) as e:
        print(f"longmoe generate: error: {e}", file=sys.stderr)
        return 2
    if engine.compiled is not None:
        print(announce(engine.compiled, args.compile_warmup), file=sys.stderr)
    with engine:
        if args.json_schema:
            try:
                params = dataclasses.replace(params, constraint=json_constraint(engine, args.json_schema))
            except StructuredOutputError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        t0 = time.perf_counter()
        try:
            images = file_patches(args.image, engine.cfg.image_limits, engine.model.cfg.vision, "--image")
            h = engine.submit(prompt, params, images=images)
        except (EngineError, ImageInputError) as e:
            print(f"longmoe generate: error: {e}", file=sys.stderr)
            return 2
        for ev in h.events():
            if ev.delta:
                sys.stdout.write(ev.delta)
                sys.stdout.flush()
        c = h.completion
        sys.stdout.write("\n")
        if args.stats and c is not None:
            dt = time.perf_counter() - t0
            print(
                f"[{c.prompt_tokens} prompt + {c.completion_tokens} generated tokens in {dt:.2f}s, "
                f"{c.completion_tokens / dt:.1f} tok/s, finish_reason={c.finish_reason}]",
                file=sys.stderr,
            )
        return 1 if c is not None and c.finish_reason == "error" else 0
