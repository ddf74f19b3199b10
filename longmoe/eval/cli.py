"""``longmoe eval``: long-context tasks (and loss by position) for a local model or any OpenAI endpoint.

Examples::

    longmoe eval --model runs/train --tasks niah,multihop,conflict,recall --lengths 1k,4k --depths 5
    longmoe eval --endpoint http://127.0.0.1:8000 --api-model longmoe --lengths 4k --n 8
    longmoe eval --model runs/train --ppl-by-position --ppl-max-len 16k
    longmoe eval --tasks agent --model runs/sft --envs doclookup,calculator --horizons 1,2,4 --n 100
    longmoe eval --tasks extract --model runs/vision_extract/model --families form_easy,receipt --n 100

Writes ``OUT/results.jsonl`` (resumable), ``OUT/summary.{json,md}``, ``OUT/ppl.{json,md}`` and
``OUT/plots/*.png``. ``--tasks agent`` scores tool-using episodes instead (``eval/agent_cli.py``),
``--tasks extract`` image -> JSON extraction on rendered documents (``eval/extract_cli.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from longmoe.argtypes import device
from longmoe.checkpoint import TOKENIZER_FILE, load_model
from longmoe.data.tokenizer import Tokenizer
from longmoe.eval import runner
from longmoe.eval.agent_cli import add_agent_arguments, run_agent
from longmoe.eval.clients import ClientError, EndpointClient, LocalClient
from longmoe.eval.extract_cli import add_extract_arguments, run_extract_cli
from longmoe.eval.plots import plot_run
from longmoe.eval.ppl import markdown_ppl, ppl_by_position
from longmoe.ops.quant import MODES as QUANT_MODES
from longmoe.quantize import quantize_model
from longmoe.tasks import FAMILIES, TASKS, TaskError, parse_tasks

DEFAULT_TASKS = ",".join(FAMILIES)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to evaluate (one of)")
    g.add_argument(
        "--model", type=Path, help="model directory or training run directory (uses its final model)"
    )
    g.add_argument(
        "--endpoint",
        "--base-url",
        dest="endpoint",
        help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000 (or .../v1)",
    )
    g = p.add_argument_group("endpoint options")
    g.add_argument("--api-model", help="model name to send to the endpoint (required with --endpoint)")
    g.add_argument("--api-key", help="bearer token for the endpoint (default: $OPENAI_API_KEY if set)")
    g.add_argument(
        "--api-mode",
        choices=["completions", "chat"],
        default="completions",
        help="POST /v1/completions with the prompt, or /v1/chat/completions with it as a user message",
    )
    g.add_argument("--timeout", type=float, default=600.0, help="seconds per endpoint request (default 600)")
    g.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json, or a model/run dir holding one, used to count task lengths (default: the "
        "model's; required with --endpoint: e.g. the served model's dir)",
    )
    g = p.add_argument_group("task grid")
    g.add_argument(
        "--tasks",
        help=f"comma-separated tasks (default {DEFAULT_TASKS}; without --ppl-by-position); known: "
        + ", ".join(TASKS)
        + "; or 'agent' alone: tool-using episodes (see the agent options); or 'extract' alone: "
        "image -> JSON on rendered documents (see the extraction options)",
    )
    g.add_argument(
        "--lengths", default="1k,4k", help="prompt lengths in tokens, e.g. 512,1k,4k,16k (default 1k,4k)"
    )
    g.add_argument(
        "--depths",
        default="5",
        help="needle depths: a count of evenly spaced ones, or a list like 0,0.5,1 (default 5)",
    )
    g.add_argument("--n", type=int, default=4, help="items per task x length x depth cell (default 4)")
    g.add_argument("--limit", type=int, help="score at most this many new items in this run (quick runs)")
    g.add_argument("--seed", type=int, default=0, help="seed of the task generators (default 0)")
    g.add_argument(
        "--max-tokens", type=int, help="cap on generated tokens per item (default: from the answer)"
    )
    g.add_argument(
        "--batch-size", type=int, default=8, help="items decoded together by the local engine (default 8)"
    )
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
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=Path("runs/eval"), help="output directory (default runs/eval)")
    g.add_argument("--device", type=device, default="cpu", help="torch device for --model (default cpu)")
    g.add_argument(
        "--quantize", choices=QUANT_MODES, default=None, help="weight-only quantization of --model"
    )
    g.add_argument("--no-plots", action="store_true", help="do not write plots")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_agent_arguments(p)
    add_extract_arguments(p)


def _error(msg: str) -> int:
    print(f"longmoe eval: error: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    if args.tasks is not None and "agent" in args.tasks.split(","):
        if args.tasks.strip() != "agent" or args.ppl_by_position:
            return _error("--tasks agent runs alone (no other tasks, no --ppl-by-position)")
        return run_agent(args)
    if args.tasks is not None and "extract" in args.tasks.split(","):
        if args.tasks.strip() != "extract" or args.ppl_by_position:
            return _error("--tasks extract runs alone (no other tasks, no --ppl-by-position)")
        return run_extract_cli(args)
    if (args.model is None) == (args.endpoint is None):
        return _error("give exactly one of --model DIR or --endpoint URL")
    if args.ppl_by_position and args.model is None:
        return _error("--ppl-by-position needs --model (it reads the model's losses directly)")
    if args.n < 1:
        return _error(f"--n {args.n} is invalid: expected an integer >= 1")
    try:
        task_spec = (
            args.tasks if args.tasks is not None else (None if args.ppl_by_position else DEFAULT_TASKS)
        )
        tasks = parse_tasks(task_spec) if task_spec else []
        lengths = runner.parse_lengths(args.lengths)
        depths = runner.parse_depths(args.depths)
    except TaskError as e:
        return _error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    client = None
    try:
        if args.endpoint is not None:
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
    except (ClientError, FileNotFoundError, ValueError) as e:
        return _error(str(e))

    if tasks:
        print(
            f"eval: {client.name}: tasks {','.join(tasks)} x lengths {lengths} x depths {depths} x n={args.n}"
        )
        try:
            grid = runner.build_grid(tasks, lengths, depths, args.n, args.seed, tokenizer)
        except TaskError as e:
            return _error(str(e))
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
        except ClientError as e:
            return _error(str(e))
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
        raise ValueError(
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
