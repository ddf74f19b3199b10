"""``python -m longmoe.pipelines.vision_extract [--steps N] [--out DIR] [--quick]``.

Trains the image extractor (resumable), evaluates it and the text-only control on held-out renders,
runs the interleaved-pretraining check, and writes ``OUT/report.md``, ``OUT/results.json`` and
``OUT/plots/``. A rerun with the same ``--out`` continues where the last one stopped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from longmoe.pipelines.recipe import add_common_arguments, config_error, recipe_parser
from longmoe.pipelines.recipe import main as recipe_main
from longmoe.pipelines.vision_extract.config import PRESETS, VisionExtractConfig, quick
from longmoe.pipelines.vision_extract.run import STAGES
from longmoe.pipelines.vision_extract.run import run as run_recipe


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, "runs/vision_extract", quick="a smoke run of seconds (a 32-wide model, 6 steps)")
    p.add_argument(
        "--config", type=Path, help="a JSON file of VisionExtractConfig fields (default: built in)"
    )
    p.add_argument(
        "--preset", choices=sorted(PRESETS), default="forms",
        help="the built-in config: forms (form_easy + form_varied, the default) or documents (form, "
        "receipt, table, figure_page in one model)",
    )  # fmt: skip
    p.add_argument(
        "--stage", choices=STAGES,
        help="train and evaluate only the image model (main) or the text control and the pretraining check "
        "(control), e.g. two processes side by side; "
        "a later run without --stage finishes the recipe from their files",
    )  # fmt: skip
    p.add_argument("--steps", type=int, help="training steps of the extractor and the control")
    p.add_argument("--batch-size", type=int, help="pages per training step")
    p.add_argument("--patch-size", type=int, help="the image model's patch side in pixels (default 8)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default from the config: 2)")
    p.add_argument(
        "--mix",
        help="training families and weights, e.g. form=1,table=0.5 (default: form_easy=1,form_varied=1)",
    )
    p.add_argument(
        "--encoder", choices=("conv", "linear", "vit"), help="the image model's patch encoder (default: conv)"
    )
    p.add_argument(
        "--read-weight", type=float, help="weight of the patch-reading loss (default 1; 0 = answer loss only)"
    )
    p.add_argument("--seed", type=int, help="seed of the model init and the training pages (default 0)")
    p.add_argument("--no-control", action="store_true", help="skip the text-only control")
    p.add_argument("--no-pretrain-check", action="store_true", help="skip the interleaved-pretraining check")
    p.add_argument("--control-steps", type=int, help="steps of the text-only control (default: --steps)")
    p.add_argument(
        "--control-inputs", choices=("text", "text_grid"), help="the control's input (default: text_grid)"
    )
    p.add_argument("--control-lrs", help="the control's lr candidates, comma-separated (e.g. 3e-3,1e-2,3e-2)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return recipe_parser("vision_extract").parse_args(argv)


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
        VisionExtractConfig.load(args.config) if args.config else PRESETS[args.preset]()
    )  # fmt: skip
    d = base.to_dict()
    for name in ("steps", "batch_size", "patch_size"):
        if getattr(args, name) is not None:
            d[name] = getattr(args, name)
    if args.threads is not None:
        d["threads"] = args.threads
    if args.mix is not None:
        d["mix"] = _mix(args.mix)
    for name in ("encoder", "read_weight", "seed"):
        if getattr(args, name) is not None:
            d[name] = getattr(args, name)
    if args.control_steps is not None:
        d["control_steps"] = args.control_steps
    if args.control_inputs is not None:
        d["control_inputs"] = args.control_inputs
    if args.control_lrs is not None:
        try:
            d["control_lrs"] = [float(x) for x in args.control_lrs.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--control-lrs {args.control_lrs!r} is invalid: expected numbers") from None
    if args.no_control:
        d["text_control"] = False
    if args.no_pretrain_check:
        d["pretrain_check"] = False
    return VisionExtractConfig.from_dict(d)


def run(args: argparse.Namespace) -> int:
    try:
        rc = load_config(args)
    except ValueError as e:
        raise config_error(e) from e
    result = run_recipe(rc, args.out, stage=args.stage)
    if result is None:
        print(f"stage {args.stage}: done in {args.out}")
        return 0
    print(f"report: {args.out / 'report.md'}")
    f1 = result.target_family_f1()
    if f1 is not None:
        print(f"{result.target_family} held-out field F1 {f1:.3f} (target {result.target_f1})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return recipe_main("vision_extract", argv)


if __name__ == "__main__":
    raise SystemExit(main())
