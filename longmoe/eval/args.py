"""Command-line options every evaluation harness shares: what to evaluate (a local model or an
OpenAI-compatible endpoint), how many items, and where to write. Each harness's ``cli`` adds its own."""

from __future__ import annotations

import argparse
from pathlib import Path

from longmoe.cli.argtypes import device
from longmoe.ops.quant import MODES as QUANT_MODES


def add_backend_arguments(p: argparse.ArgumentParser, api_mode: bool = False) -> None:
    """``--model`` / ``--endpoint`` and the endpoint's options (``api_mode``: also ``--api-mode``)."""
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
    if api_mode:
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
        help="tokenizer.json used to count task lengths (default: the model's; for an endpoint, a "
        "2048-token BPE trained on the standard library, an approximation of the server's tokenizer)",
    )


def add_count_arguments(
    g: argparse._ArgumentGroup, batch: bool = True, n_help: str = "items per task x length x depth cell"
) -> None:
    """``--n``, ``--limit``, ``--seed``, ``--max-tokens`` (and ``--batch-size``) in group ``g``."""
    g.add_argument("--n", type=int, default=4, help=f"{n_help} (default 4)")
    g.add_argument("--limit", type=int, help="score at most this many new items in this run (quick runs)")
    g.add_argument("--seed", type=int, default=0, help="seed of the task generators (default 0)")
    g.add_argument(
        "--max-tokens", type=int, help="cap on generated tokens per item (default: from the answer)"
    )
    if batch:
        g.add_argument(
            "--batch-size", type=int, default=8, help="items decoded together by the local engine (default 8)"
        )


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, default=Path("runs/eval"), help="output directory (default runs/eval)")
    g.add_argument("--device", type=device, default="cpu", help="torch device for --model (default cpu)")
    g.add_argument(
        "--quantize", choices=QUANT_MODES, default=None, help="weight-only quantization of --model"
    )
    g.add_argument("--no-plots", action="store_true", help="do not write plots")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
