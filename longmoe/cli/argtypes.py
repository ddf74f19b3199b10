"""``argparse`` value types the commands share, so a bad flag fails while the arguments are parsed
(``longmoe <command>: error: argument --flag: ...``, exit status 2) instead of deep inside a run."""

from __future__ import annotations

import argparse

import torch

MAX_PORT = 65535


def positive_int(value: str) -> int:
    """An integer >= 1 (a step count, a batch size)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is invalid: expected an integer >= 1")
    return n


def positive_float(value: str) -> float:
    """A finite float > 0 (a scale factor)."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not (0 < x < float("inf")):
        raise argparse.ArgumentTypeError(f"{value} is invalid: expected a finite number > 0")
    return x


def port(value: str) -> int:
    """A TCP port, 0-65535 (0: the system picks a free one)."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if not 0 <= n <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{n} is invalid: expected a port in 0-{MAX_PORT}")
    return n


def device(value: str) -> str:
    """A torch device that exists on this machine (``cpu``, ``cuda``, ``cuda:1``, ``mps``), checked before
    any weights are read so the error names the device, not the weights file."""
    try:
        d = torch.device(value)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a torch device (e.g. cpu, cuda, cuda:0)"
        ) from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise argparse.ArgumentTypeError(
                f"{value!r} requested but CUDA is not available ({why}); use cpu"
            )
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"{value!r} requested but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    elif d.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{value!r} requested but MPS is not available; use cpu")
    return value
