"""``longmoe eval --tasks extract``: image -> JSON field extraction on held-out rendered documents.

Examples::

    longmoe eval --tasks extract --model runs/vision_extract/model --families form_easy --n 200
    longmoe eval --tasks extract --endpoint http://127.0.0.1:8000 --api-model longmoe --n 50
    longmoe eval --tasks extract --base-url https://api.openai.com/v1 --api-model gpt-4o-mini \\
        --families form,receipt,table --n 20 --extract-input text     # the text-only control

Scores ``--n`` held-out renders per family (seeds ``HELD_OUT_SEED_BASE + --seed ...``, never used
for training) and writes ``OUT/extract_results.jsonl`` (resumable) and ``OUT/extract_summary.{json,md}``:
field precision/recall/F1, exact match and JSON validity per family, with standard errors.
"""

from __future__ import annotations

import argparse
import os
import sys

from longmoe.eval.clients import ClientError
from longmoe.eval.extract import run_extract
from longmoe.eval.extract_clients import INPUTS, EndpointExtractClient
from longmoe.eval.extract_local import LocalExtractClient
from longmoe.tasks import TaskError
from longmoe.tasks.documents import FAMILIES, parse_families


def add_extract_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("structured extraction (--tasks extract)")
    g.add_argument(
        "--families",
        default="all",
        help=f"document families, comma-separated (default: all: {','.join(FAMILIES)})",
    )
    g.add_argument(
        "--extract-input",
        choices=INPUTS,
        default="image",
        help="show the page as an image (default) or its content as text (the text-only control)",
    )


def _error(msg: str) -> int:
    print(f"longmoe eval: error: {msg}", file=sys.stderr)
    return 2


def run_extract_cli(args: argparse.Namespace) -> int:
    if (args.model is None) == (args.endpoint is None):
        return _error("give exactly one of --model DIR or --endpoint URL")
    if args.n < 1:
        return _error(f"--n {args.n} is invalid: expected an integer >= 1")
    if args.seed < 0:
        return _error(f"--seed {args.seed} is invalid: expected an integer >= 0")
    try:
        families = parse_families(args.families)
    except TaskError as e:
        return _error(str(e))
    key = args.api_key or os.environ.get(getattr(args, "api_key_env", None) or "OPENAI_API_KEY")
    try:
        if args.endpoint is not None:
            client = EndpointExtractClient(
                args.endpoint, args.api_model or "", api_key=key, inputs=args.extract_input,
                timeout=args.timeout,
            )  # fmt: skip
            count = len
        else:
            client = LocalExtractClient(args.model, device=args.device, inputs=args.extract_input)
            count = client.count_tokens
    except (ClientError, FileNotFoundError, ValueError) as e:
        return _error(str(e))
    print(f"eval extract: {client.name}: families {','.join(families)} x n={args.n} ({args.extract_input})")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        summary = run_extract(
            client, families, args.n, args.out, offset=args.seed, batch_size=args.batch_size,
            max_tokens=args.max_tokens, count_tokens=count,
        )  # fmt: skip
    except ClientError as e:
        return _error(str(e))
    finally:
        client.close()
    print((args.out / "extract_summary.md").read_text(), end="")
    print(f"results in {args.out}")
    return 0 if summary["n_items"] else 1
