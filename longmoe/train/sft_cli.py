"""``longmoe sft``: supervised fine-tuning on expert tool-use demonstrations (new run or ``--resume``).

See ``train/sft.py`` for what is trained and logged; ``docs/agent.md`` for the chat format and the
environments.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from longmoe.cli.argtypes import positive_int
from longmoe.data.stages import CurriculumStage
from longmoe.envs import ENVS
from longmoe.errors import UserError
from longmoe.train.config import TrainConfig
from longmoe.train.plots import render
from longmoe.train.run import check_resumable
from longmoe.train.sft import SFT_CONFIG, SFTConfig, SFTTrainer, sft_stage


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("start")
    g.add_argument(
        "--init-from",
        help="pretrained training run or model directory to fine-tune (required for a new run)",
    )
    g = p.add_argument_group("demonstrations")
    g.add_argument(
        "--envs",
        default="doclookup,calculator",
        help=f"environments and weights, e.g. 'doclookup=2,calculator=1' (from {sorted(ENVS)}); "
        "default: both, equal weights",
    )
    g.add_argument("--horizons", default="1,2,3", help="horizons drawn per demonstration (default 1,2,3)")
    g.add_argument(
        "--env-option",
        action="append",
        default=[],
        metavar="ENV.FIELD=VALUE",
        help="an environment config field, e.g. doclookup.page_chars=200 (repeatable)",
    )
    g.add_argument(
        "--max-len", type=positive_int, default=2048, help="demonstration tokens kept (default 2048)"
    )
    g = p.add_argument_group("batches and replay")
    g.add_argument("--steps", type=positive_int, default=200, help="optimizer steps (default 200)")
    g.add_argument("--batch-size", type=positive_int, default=4, help="demonstrations per batch (default 4)")
    g.add_argument(
        "--replay-fraction",
        type=float,
        default=0.25,
        help="replay windows of pretraining text per batch, as r/(1-r) x batch-size (0: none; default 0.25)",
    )
    g.add_argument(
        "--replay-window",
        type=positive_int,
        default=256,
        help="tokens per replay window, also the validation window (default 256)",
    )
    g.add_argument("--data", help="replay text file/directory (default: the embedded stdlib corpus)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (default 3e-4)")
    g.add_argument("--warmup-steps", type=int, default=10, help="linear warmup steps (default 10)")
    g.add_argument("--schedule", choices=["cosine", "wsd", "constant"], default="cosine", help="LR schedule")
    g.add_argument(
        "--grad-accum", type=positive_int, default=1, help="batches per optimizer step (default 1)"
    )
    g.add_argument("--seed", type=int, default=0, help="seed for data order and demonstrations (default 0)")
    g.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward pass")
    g.add_argument(
        "--freeze-router",
        action="store_true",
        help="freeze every MoE router and balancing bias (guards against routing drift)",
    )
    g.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    g = p.add_argument_group("run")
    g.add_argument(
        "--run-dir", type=Path, default=Path("runs/sft"), help="output directory (default runs/sft)"
    )
    g.add_argument(
        "--resume", action="store_true", help="continue the run in --run-dir from its newest checkpoint"
    )
    g.add_argument(
        "--drift-every",
        type=int,
        default=10,
        help="steps between routing-drift measurements vs the starting model (0: never; default 10)",
    )
    g.add_argument(
        "--ckpt-every", type=int, default=50, help="steps between checkpoints (0: only at the end)"
    )
    g.add_argument(
        "--eval-every", type=int, default=50, help="steps between validation passes on replay text"
    )
    g.add_argument("--keep-last", type=positive_int, default=3, help="complete checkpoints to keep")
    g.add_argument(
        "--max-steps", type=positive_int, help="stop after this many optimizer steps (checkpointed)"
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument(
        "--no-plots", action="store_true", help="do not render loss/balance/drift plots at the end"
    )


def parse_weights(spec: str) -> dict[str, float]:
    """'doclookup=2,calculator' -> {'doclookup': 2.0, 'calculator': 1.0}."""
    out = {}
    for part in filter(None, (s.strip() for s in spec.split(","))):
        name, _, w = part.partition("=")
        try:
            out[name.strip()] = float(w) if w else 1.0
        except ValueError:
            raise UserError(f"--envs: weight {w!r} of {name!r} is not a number") from None
    return out


def parse_env_options(items: list[str]) -> dict[str, dict[str, Any]]:
    """['doclookup.page_chars=200'] -> {'doclookup': {'page_chars': 200}} (values parsed as JSON)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        env, dot, name = key.partition(".")
        if not (eq and dot and env and name):
            raise UserError(f"--env-option {item!r}: expected ENV.FIELD=VALUE, e.g. doclookup.page_chars=200")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(env, {})[name] = value
    return out


def build_configs(args: argparse.Namespace) -> tuple[SFTConfig, TrainConfig]:
    try:
        horizons = [int(h) for h in args.horizons.split(",") if h.strip()]
    except ValueError:
        raise UserError(f"--horizons {args.horizons!r}: expected integers separated by commas") from None
    if args.init_from is None:
        raise UserError("--init-from is required for a new run (a pretrained run or model directory)")
    sft = SFTConfig(
        init_from=str(args.init_from), envs=parse_weights(args.envs), horizons=horizons,
        env_options=parse_env_options(args.env_option), max_len=args.max_len, drift_every=args.drift_every,
    )  # fmt: skip
    if not 0.0 <= args.replay_fraction < 1.0:
        raise UserError(f"--replay-fraction {args.replay_fraction}: expected a number in [0, 1)")
    stage: CurriculumStage = sft_stage(
        args.steps * args.grad_accum, args.batch_size, args.replay_fraction, args.replay_window, {"file": 1.0}
    )
    tcfg = TrainConfig(
        stages=[stage], lr=args.lr, warmup_steps=args.warmup_steps, schedule=args.schedule,
        grad_accum=args.grad_accum, seed=args.seed, bf16=args.bf16, freeze_router=args.freeze_router,
        ckpt_every=args.ckpt_every, eval_every=args.eval_every, keep_last=args.keep_last, data=args.data,
    )  # fmt: skip
    return sft, tcfg


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    launch = {"progress": not args.no_progress, "max_steps": args.max_steps, "device": args.device}
    try:
        if args.resume:
            check_resumable(args.run_dir, SFT_CONFIG)
            trainer = SFTTrainer(args.run_dir, resume=True, **launch)
        else:
            sft, tcfg = build_configs(args)
            trainer = SFTTrainer(args.run_dir, sft, tcfg, **launch)
        summary = trainer.fit()
    except UserError:
        raise
    except ValueError as e:  # validation below the config layer (data mixes, packing) raises ValueError
        raise UserError(str(e)) from e
    if not args.no_plots:
        render(args.run_dir)
    print(json.dumps(summary))
    return 0
