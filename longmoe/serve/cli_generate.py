"""``longmoe generate --model DIR "prompt"``: stream a completion to the terminal.

``--image FILE`` (repeatable, a model with a vision encoder) puts each image's token span before the
prompt text, in the order given.

Also home of the options every serving command shares (engine knobs and sampling flags).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from longmoe.argtypes import device
from longmoe.ops.quant import MODES as QUANT_MODES
from longmoe.serve.compiled import announce
from longmoe.serve.engine import Engine
from longmoe.serve.errors import EngineError
from longmoe.serve.images import ImageInputError, file_patches
from longmoe.serve.sampling import SamplingError, SamplingParams, TokenConstraint
from longmoe.serve.structured import JsonFormat, JsonGrammars, StructuredOutputError


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model directory, or a training run directory")
    p.add_argument("--device", type=device, default="cpu", help="torch device to run on (default: cpu)")
    p.add_argument(
        "--prefill-chunk", type=int, default=512, help="prompt tokens per prefill step (default 512)"
    )
    p.add_argument("--max-batch", type=int, default=32, help="requests decoded together (default 32)")
    p.add_argument(
        "--max-context", type=int, default=None,
        help="tokens a request may hold, prompt + completion; longer prompts are refused with an error "
        "(default: the model's max_seq_len; NoPE + KDA run past it, e.g. 1048576 for a 1M window)",
    )  # fmt: skip
    p.add_argument(
        "--cache-budget-mb", type=float, default=1024.0, help="cache memory for all requests, MiB (1024)"
    )
    p.add_argument(
        "--quantize",
        choices=QUANT_MODES,
        default=None,
        help="weight-only quantization of linear and expert weights (see docs/serve.md)",
    )
    p.add_argument(
        "--quantize-head",
        action="store_true",
        help="with --quantize: pack the LM head too (as llama.cpp's q8_0 files do; default: kept in float)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step (compiled graphs cached on disk; see docs/serve.md)",
    )
    p.add_argument(
        "--compile-warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --compile: compile in the background at start, eager steps until ready (default on)",
    )
    p.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse state snapshots of earlier prompts' shared prefixes (default on)",
    )
    p.add_argument("--prefix-block-size", type=int, default=16, help="tokens per prefix-reuse snapshot (16)")
    p.add_argument("--draft-model", default=None, help="draft model directory: speculative decoding")
    p.add_argument(
        "--num-speculative-tokens", type=int, default=3, help="tokens the draft proposes per step (3)"
    )
    p.add_argument("--max-images", type=int, default=4, help="images per request (4)")
    p.add_argument("--max-image-kb", type=int, default=1024, help="encoded size per image, KiB (1024)")
    p.add_argument(
        "--max-image-pixels", type=int, default=4096 * 4096, help="width x height per image (4096*4096)"
    )


def engine_from_args(args: argparse.Namespace) -> Engine:
    return Engine.from_dir(
        args.model,
        device=args.device,
        prefill_chunk=args.prefill_chunk,
        max_batch=args.max_batch,
        max_context=args.max_context,
        cache_budget_bytes=int(args.cache_budget_mb * 2**20),
        quantize=args.quantize,
        quantize_head=args.quantize_head,
        compile=args.compile,
        compile_warmup=args.compile_warmup,
        prefix_cache=args.prefix_cache,
        prefix_block_size=args.prefix_block_size,
        draft_model=args.draft_model,
        num_speculative_tokens=args.num_speculative_tokens,
        max_images=args.max_images,
        max_image_bytes=args.max_image_kb * 1024,
        max_image_pixels=args.max_image_pixels,
    )


def add_sampling_arguments(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate ({max_tokens})")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (1 = off; 0.95)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1.0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI frequency penalty (0)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed: same seed, same output")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def params_from_args(args: argparse.Namespace, **extra: object) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=list(args.stop),
        **extra,
    )


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
