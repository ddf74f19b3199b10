"""``longmoe eval extract`` (or ``longmoe eval --tasks extract``): image -> JSON field extraction on
held-out rendered documents.

Examples::

    longmoe eval extract --model runs/vision_extract/model --families form_easy --n 200
    longmoe eval extract --endpoint http://127.0.0.1:8000 --api-model longmoe --n 50
    longmoe eval extract --base-url https://api.openai.com/v1 --api-model gpt-4o-mini \\
        --families form,receipt,table --n 20 --extract-input text     # the text-only control

Scores ``--n`` held-out renders per family (seeds ``HELD_OUT_SEED_BASE + --seed ...``, never used
for training) and writes ``OUT/extract_results.jsonl`` (resumable) and ``OUT/extract_summary.{json,md}``:
field precision/recall/F1, exact match and JSON validity per family, with standard errors.
"""

from __future__ import annotations

import argparse
import os

from longmoe.eval.args import add_backend_arguments, add_count_arguments, add_output_arguments
from longmoe.eval.errors import EvalError, check_positive
from longmoe.eval.extract.clients import EndpointExtractClient
from longmoe.eval.extract.harness import run_extract
from longmoe.eval.extract.local import LOCAL_INPUTS, LocalExtractClient
from longmoe.tasks.documents import FAMILIES, parse_families


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``longmoe eval extract``'s options."""
    add_backend_arguments(p)
    add_count_arguments(p.add_argument_group("documents"), n_help="held-out documents per family")
    add_output_arguments(p)
    add_extract_arguments(p)


def add_extract_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("structured extraction (longmoe eval extract, or --tasks extract)")
    g.add_argument(
        "--families",
        default="all",
        help=f"document families, comma-separated (default: all: {','.join(FAMILIES)})",
    )
    g.add_argument(
        "--extract-input",
        choices=LOCAL_INPUTS,
        default="image",
        help="show the page as an image (default) or its content as text (the text-only control); "
        "text_grid (local models only): the text as a character grid with row/column positions; "
        "pdf: the page written as a PDF and rendered back by the server's PDF path (pypdfium2)",
    )


def run(args: argparse.Namespace) -> int:
    """Score ``--n`` held-out documents per family; a bad flag raises ``EvalError`` (or ``TaskError``)."""
    if (args.model is None) == (args.endpoint is None):
        raise EvalError("give exactly one of --model DIR or --endpoint URL")
    check_positive("--n", args.n)
    if args.seed < 0:
        raise EvalError(f"--seed {args.seed} is invalid: expected an integer >= 0")
    families = parse_families(args.families)
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
    except ValueError as e:
        raise EvalError(str(e)) from e
    print(f"eval extract: {client.name}: families {','.join(families)} x n={args.n} ({args.extract_input})")
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        summary = run_extract(
            client, families, args.n, args.out, offset=args.seed, batch_size=args.batch_size,
            max_tokens=args.max_tokens, count_tokens=count,
        )  # fmt: skip
    finally:
        client.close()
    print((args.out / "extract_summary.md").read_text(), end="")
    print(f"results in {args.out}")
    return 0 if summary["n_items"] else 1
