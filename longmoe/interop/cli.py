"""``longmoe convert``: transformers Kimi-Linear checkpoints <-> longmoe model directories.

    longmoe convert --from-hf SRC --out DST [--dtype float32|bfloat16]
    longmoe convert --to-hf SRC --out DST
    longmoe convert --to-gguf SRC --out FILE [--outtype f32|f16|q8_0]

Prints the wall time and the process's peak resident memory (the conversion streams tensors, so the
peak stays near the largest single tensor plus one layer's experts, not the model size).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys
import time
from pathlib import Path

from longmoe.config import DTYPES, ConfigError
from longmoe.interop.kimi_config import ConversionError
from longmoe.interop.kimi_linear import from_hf, to_hf


def add_arguments(parser: argparse.ArgumentParser) -> None:
    way = parser.add_mutually_exclusive_group(required=True)
    way.add_argument(
        "--from-hf", type=Path, metavar="SRC", help="a transformers KimiLinearForCausalLM directory"
    )
    way.add_argument("--to-hf", type=Path, metavar="SRC", help="a longmoe model directory")
    way.add_argument(
        "--to-gguf", type=Path, metavar="SRC", help="a longmoe model directory, for llama.cpp (kimi-linear)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DST",
        help="directory to write (--to-gguf: the .gguf file)",
    )
    parser.add_argument(
        "--outtype",
        choices=("f32", "f16", "q8_0"),
        default=None,
        help="--to-gguf: tensor type of the matrices (default f32; vectors stay f32)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default=None,
        help="--from-hf: longmoe weight dtype (default: the source's)",
    )


def peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM`` (reset by exec, unlike ``ru_maxrss``, which a child
    inherits from the process that forked it), else ``ru_maxrss``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _dir_mb(d: Path) -> float:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file()) / 2**20


def _run_gguf(args: argparse.Namespace, t0: float) -> int:
    try:
        if args.dtype is not None:
            raise ConversionError("--dtype applies to --from-hf only (--to-gguf takes --outtype)")
        try:
            from longmoe.interop.gguf_export import to_gguf
        except ImportError as e:
            raise ConversionError(
                f"--to-gguf needs the gguf package ({e}): pip install 'longmoe[gguf]'"
            ) from None
        cfg = to_gguf(args.to_gguf, args.out, outtype=args.outtype or "f32")
    except (ConversionError, ConfigError, FileNotFoundError) as e:
        print(f"longmoe convert: error: {e}", file=sys.stderr)
        return 2
    print(
        f"converted {args.to_gguf} ({_dir_mb(args.to_gguf):.1f} MB) -> {args.out} "
        f"({args.out.stat().st_size / 2**20:.1f} MB, {args.outtype or 'f32'}): {cfg.n_layers} layers "
        f"({cfg.layer_pattern}), d_model {cfg.d_model}; {time.perf_counter() - t0:.1f} s, "
        f"peak RSS {peak_rss_mb():.0f} MB"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    if args.to_gguf is not None:
        return _run_gguf(args, t0)
    try:
        if args.outtype is not None:
            raise ConversionError("--outtype applies to --to-gguf only")
        if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
            raise ConversionError(f"--out {args.out} exists and is not an empty directory")
        if args.from_hf is not None:
            cfg = from_hf(args.from_hf, args.out, dtype=args.dtype)
            what = f"{cfg.n_layers} layers ({cfg.layer_pattern}), d_model {cfg.d_model}, {cfg.dtype}"
        else:
            if args.dtype is not None:
                raise ConversionError("--dtype applies to --from-hf only (--to-hf keeps the model's dtype)")
            hf = to_hf(args.to_hf, args.out)
            what = f"{hf['num_hidden_layers']} layers, hidden {hf['hidden_size']}, {hf['dtype']}"
    except (ConversionError, ConfigError, FileNotFoundError) as e:
        print(f"longmoe convert: error: {e}", file=sys.stderr)
        return 2
    src = args.from_hf if args.from_hf is not None else args.to_hf
    print(
        f"converted {src} ({_dir_mb(src):.1f} MB) -> {args.out} ({_dir_mb(args.out):.1f} MB): {what}; "
        f"{time.perf_counter() - t0:.1f} s, peak RSS {peak_rss_mb():.0f} MB"
    )
    return 0
