"""``python -m longmoe.pipelines.vision_extract [--steps N] [--out DIR] [--quick]``.

Trains the image extractor (resumable), evaluates it and the text-only control on held-out renders,
runs the interleaved-pretraining check, and writes ``OUT/report.md``, ``OUT/results.json`` and
``OUT/plots/``. A rerun with the same ``--out`` continues where the last one stopped.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from longmoe.pipelines.vision_extract.config import VisionExtractConfig, quick
from longmoe.pipelines.vision_extract.run import run

MODULE = "longmoe.pipelines.vision_extract"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    p.add_argument(
        "--config", type=Path, help="a JSON file of VisionExtractConfig fields (default: built in)"
    )
    p.add_argument("--out", type=Path, default=Path("runs/vision_extract"), help="output directory")
    p.add_argument("--steps", type=int, help="training steps of the extractor and the control")
    p.add_argument("--threads", type=int, help="torch CPU threads (default from the config: 2)")
    p.add_argument(
        "--mix", help="training families and weights, e.g. form_easy=1,form=0.5 (default: form_easy only)"
    )
    p.add_argument("--no-control", action="store_true", help="skip the text-only control")
    p.add_argument("--control-steps", type=int, help="steps of the text-only control (default: --steps)")
    p.add_argument("--quick", action="store_true", help="a smoke run of seconds (a 32-wide model, 6 steps)")
    return p.parse_args(argv)


def _mix(spec: str) -> dict[str, float]:
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, w = part.partition("=")
        try:
            out[name.strip()] = float(w) if w else 1.0
        except ValueError:
            raise ValueError(
                f"--mix item {part!r} is invalid: expected family=weight, e.g. form=0.5"
            ) from None
    return out


def load_config(args: argparse.Namespace) -> VisionExtractConfig:
    base = quick() if args.quick else (
        VisionExtractConfig.load(args.config) if args.config else VisionExtractConfig()
    )  # fmt: skip
    d = base.to_dict()
    if args.steps is not None:
        d["steps"] = args.steps
    if args.threads is not None:
        d["threads"] = args.threads
    if args.mix is not None:
        d["mix"] = _mix(args.mix)
    if args.control_steps is not None:
        d["control_steps"] = args.control_steps
    if args.no_control:
        d["text_control"] = False
    return VisionExtractConfig.from_dict(d)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rc = load_config(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"vision_extract: error: {e}", file=sys.stderr)
        return 2
    result = run(rc, args.out)
    print(f"report: {args.out / 'report.md'}")
    f1 = result.form_easy_f1()
    if f1 is not None:
        print(f"form_easy held-out field F1 {f1:.3f} (target {result.target_f1})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
