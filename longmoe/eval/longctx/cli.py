"""``longmoe eval longctx``: long-context tasks (and loss by position) for a local model or any
OpenAI endpoint.

Examples::

    longmoe eval longctx --model runs/train --tasks niah,multihop,conflict,recall --lengths 1k,4k --depths 5
    longmoe eval longctx --endpoint http://127.0.0.1:8000 --api-model longmoe --lengths 4k --n 8
    longmoe eval longctx --endpoint http://127.0.0.1:8000 --api-model longmoe --as-files pdf --tokenizer DIR
    longmoe eval longctx --model runs/train --ppl-by-position --ppl-max-len 16k

Writes ``OUT/results.jsonl`` (resumable), ``OUT/summary.{json,md}``, ``OUT/ppl.{json,md}`` and
``OUT/plots/*.png``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from longmoe.checkpoint import TOKENIZER_FILE, load_model
from longmoe.data.tokenizer import Tokenizer
from longmoe.eval.args import add_backend_arguments, add_count_arguments, add_output_arguments
from longmoe.eval.clients import EndpointClient, FileEndpointClient, LocalClient
from longmoe.eval.errors import EvalError, check_positive
from longmoe.eval.longctx import runner
from longmoe.eval.plots import plot_run
from longmoe.eval.ppl import markdown_ppl, ppl_by_position
from longmoe.quantize import quantize_model
from longmoe.tasks import FAMILIES, TASKS, parse_tasks

DEFAULT_TASKS = ",".join(FAMILIES)
TASKS_HELP = (
    f"comma-separated tasks (default {DEFAULT_TASKS}; without --ppl-by-position); known: " + ", ".join(TASKS)
)


def add_arguments(p: argparse.ArgumentParser, tasks_help: str = TASKS_HELP) -> None:
    add_backend_arguments(p, api_mode=True)
    g = p.add_argument_group("task grid")
    g.add_argument("--tasks", help=tasks_help)
    g.add_argument(
        "--lengths", default="1k,4k", help="prompt lengths in tokens, e.g. 512,1k,4k,16k (default 1k,4k)"
    )
    g.add_argument(
        "--depths",
        default="5",
        help="needle depths: a count of evenly spaced ones, or a list like 0,0.5,1 (default 5)",
    )
    add_count_arguments(g)
    g = p.add_argument_group("loss by position")
    g.add_argument(
        "--ppl-by-position", action="store_true", help="also measure loss per position bucket (needs --model)"
    )
    g.add_argument("--ppl-max-len", default=None, help="tokens per document (default 4x the training window)")
    g.add_argument(
        "--ppl-window",
        type=int,
        help="training window to mark (default: the largest stage window of the run, else max_seq_len)",
    )
    g.add_argument("--ppl-docs", type=int, default=4, help="validation documents to average over (default 4)")
    g.add_argument("--ppl-bucket", type=int, help="positions per bucket (default max_len / 32)")
    g.add_argument("--ppl-chunk", type=int, default=1024, help="tokens per forward call (default 1024)")
    g.add_argument(
        "--data", help="documents for --ppl-by-position (default: standard-library validation files)"
    )
    g.add_argument(
        "--as-files", choices=("text", "pdf"), default=None,
        help="with --endpoint: upload each item's context through the Files API (as Markdown or as a PDF) "
        "and ask its question about the file (default: the context inline)",
    )  # fmt: skip
    add_output_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Score the task grid (and/or loss by position); a bad flag raises ``EvalError``."""
    if (args.model is None) == (args.endpoint is None):
        raise EvalError("give exactly one of --model DIR or --endpoint URL")
    if args.ppl_by_position and args.model is None:
        raise EvalError("--ppl-by-position needs --model (it reads the model's losses directly)")
    check_positive("--n", args.n)
    task_spec = args.tasks if args.tasks is not None else (None if args.ppl_by_position else DEFAULT_TASKS)
    tasks = parse_tasks(task_spec) if task_spec else []  # a bad name raises TaskError (a UserError)
    lengths = runner.parse_lengths(args.lengths)
    depths = runner.parse_depths(args.depths)
    args.out.mkdir(parents=True, exist_ok=True)
    client = None
    try:
        if args.as_files and args.endpoint is None:
            raise EvalError("--as-files needs --endpoint (a server with the Files API on)")
        if args.endpoint is not None and args.as_files:
            client = FileEndpointClient(
                args.endpoint,
                args.api_model or "",
                args.as_files,
                api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
                timeout=args.timeout,
            )
            tokenizer = _endpoint_tokenizer(args.tokenizer)
        elif args.endpoint is not None:
            client = EndpointClient(
                args.endpoint,
                args.api_model or "",
                api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
                mode=args.api_mode,
                timeout=args.timeout,
            )
            tokenizer = _endpoint_tokenizer(args.tokenizer)
        elif tasks:
            client = LocalClient(args.model, device=args.device, quantize=args.quantize)
            tokenizer = client.tokenizer
            if args.tokenizer is not None:
                print("note: --tokenizer is ignored with --model (the model's own tokenizer counts lengths)")
    except ValueError as e:
        raise EvalError(str(e)) from e

    if tasks:
        print(
            f"eval: {client.name}: tasks {','.join(tasks)} x lengths {lengths} x depths {depths} x n={args.n}"
        )
        grid = runner.build_grid(tasks, lengths, depths, args.n, args.seed, tokenizer)
        try:
            runner.run_grid(
                client,
                grid,
                args.out,
                tokenizer,
                limit=args.limit,
                max_tokens=args.max_tokens,
                batch_size=args.batch_size,
                progress=not args.no_progress,
            )
        finally:
            if hasattr(client, "close"):
                client.close()
        summary = runner.write_summary(args.out)
        print(runner.markdown_summary(summary))
    if args.ppl_by_position:
        _run_ppl(args)
    if not args.no_plots:
        for p in plot_run(args.out):
            print(f"wrote {p}")
    print(f"results in {args.out}")
    return 0


def _endpoint_tokenizer(path: Path | None) -> Tokenizer:
    if path is None:
        raise EvalError(
            "--endpoint needs --tokenizer FILE|DIR to count task lengths (e.g. the served model's dir)"
        )
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--tokenizer: file not found: {path}")
    return Tokenizer.from_file(path)


def _run_ppl(args: argparse.Namespace) -> None:
    model, tok, meta = load_model(args.model, args.device)
    if args.quantize:
        quantize_model(model, args.quantize)
    d = meta.model_dir
    window = args.ppl_window or meta.training_window
    max_len = runner.parse_lengths(args.ppl_max_len)[0] if args.ppl_max_len else 4 * window
    print(f"ppl by position: {d}, window {window}, {args.ppl_docs} documents of {max_len} tokens")
    with torch.no_grad():
        res = ppl_by_position(
            model, tok, max_len, window, args.ppl_docs, args.ppl_bucket, args.ppl_chunk, data=args.data
        )
    res["model"] = str(d)
    (args.out / "ppl.json").write_text(json.dumps(res, indent=2) + "\n")
    md = markdown_ppl(res)
    (args.out / "ppl.md").write_text(md)
    print(md)
