"""``longmoe train``: pretrain a model through the context curriculum (new run or ``--resume``).

Scale-out: ``torchrun --nproc-per-node N -m longmoe train ... --dp-shard A --ep B --cp C`` (A·B·C = N
processes; see ``train/sharding.py``). Without ``torchrun`` it is one process, as always.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from longmoe import checkpoint as ckpt
from longmoe.cli.argtypes import positive_float, positive_int
from longmoe.config import ConfigError, ModelConfig
from longmoe.configio import load_json
from longmoe.data.stages import CurriculumStage, tiny_curriculum
from longmoe.data.tokenizer import Tokenizer
from longmoe.distributed.parallel_dims import ParallelDims, barrier, is_rank0, teardown, world_size
from longmoe.errors import UserError
from longmoe.presets import preset
from longmoe.train.config import TrainConfig
from longmoe.train.plots import render
from longmoe.train.pretrain import Trainer
from longmoe.train.run import check_resumable, train_tokenizer

DEFAULT_PRESET = "tiny"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--preset", help=f"model preset (tiny, tiny-dense, tiny-vision, small); default {DEFAULT_PRESET}"
    )
    g.add_argument("--config", type=Path, help="model config.json (overrides --preset)")
    g = p.add_argument_group("data")
    g.add_argument(
        "--data",
        help="text/JSONL/Parquet file or directory to train on (default: embedded stdlib corpus)",
    )
    g.add_argument(
        "--tokenizer", type=Path, help="existing tokenizer.json (default: train a byte-level BPE on the data)"
    )
    g.add_argument(
        "--no-synthetic",
        action="store_true",
        help="leave the synthetic long-context task documents out of the long-window stages",
    )
    g.add_argument(
        "--synthetic-loss",
        choices=["all", "answer"],
        help="targets in task documents: every token (default) or only the answers, SFT-style "
        "(sets every stage's synthetic_loss)",
    )
    g = p.add_argument_group("schedule")
    g.add_argument("--train-config", type=Path, help="train_config.json (curriculum + optimiser settings)")
    g.add_argument(
        "--scale",
        type=positive_float,
        default=1.0,
        help="multiply every stage's token budget (default curriculum only)",
    )
    g.add_argument("--lr", type=float, help="peak learning rate")
    g.add_argument("--schedule", choices=["cosine", "wsd", "constant"], help="learning-rate schedule")
    g.add_argument("--grad-accum", type=int, help="batches per optimizer step")
    g.add_argument("--seed", type=int, help="seed for weights, data order and sampling")
    g.add_argument("--bf16", action="store_true", help="bf16 autocast for the forward pass")
    g.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    g.add_argument(
        "--max-steps", type=positive_int, help="stop after this many optimizer steps (checkpoint included)"
    )
    g = p.add_argument_group("parallel (under torchrun; the product must equal the number of processes)")
    g.add_argument("--dp-shard", type=int, help="FSDP2 data-parallel sharding degree (default: what is left)")
    g.add_argument("--ep", type=int, help="expert-parallel degree (default 1)")
    g.add_argument("--cp", type=int, help="context-parallel degree (default 1)")
    g.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute mixers/dense FFNs in the backward"
    )
    g.add_argument("--device", default="cpu", help="cpu or cuda (one GPU per process); default cpu")
    g = p.add_argument_group("run")
    g.add_argument(
        "--run-dir", type=Path, default=Path("runs/train"), help="output directory (default runs/train)"
    )
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --run-dir from its newest complete checkpoint",
    )
    g.add_argument("--ckpt-every", type=int, help="optimizer steps between checkpoints (0: only at the end)")
    g.add_argument("--eval-every", type=int, help="optimizer steps between validation passes")
    g.add_argument("--keep-last", type=int, help="complete checkpoints to keep")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--no-plots", action="store_true", help="do not render loss.png / balance.png at the end")


OVERRIDES = (
    "lr", "schedule", "grad_accum", "seed", "ckpt_every", "eval_every", "keep_last", "dp_shard", "ep", "cp",
)  # fmt: skip


def build_train_config(args: argparse.Namespace) -> TrainConfig:
    if args.train_config is not None:
        if not args.train_config.is_file():
            raise FileNotFoundError(f"--train-config: file not found: {args.train_config}")
        d, where = load_json(args.train_config), str(args.train_config)
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: a train config must be a JSON object, got {type(d).__name__}")
    else:
        d, where = {"stages": tiny_curriculum(args.scale, synthetic=not args.no_synthetic)}, None
    for k in OVERRIDES:
        if getattr(args, k) is not None:
            d[k] = getattr(args, k)
    if args.synthetic_loss is not None:
        d["stages"] = [
            dataclasses.replace(st, synthetic_loss=args.synthetic_loss)
            if isinstance(st, CurriculumStage)
            else {**st, "synthetic_loss": args.synthetic_loss}
            for st in d["stages"]
        ]
    if args.bf16:
        d["bf16"] = True
    if args.compile:
        d["compile"] = True
    if args.activation_checkpointing:
        d["activation_checkpointing"] = True
    if args.data is not None:
        d["data"] = args.data
    return TrainConfig.from_dict(d, where=where)


def build_model_config(args: argparse.Namespace) -> ModelConfig:
    if args.config is not None:
        if not args.config.is_file():
            raise FileNotFoundError(f"--config: file not found: {args.config}")
        return ModelConfig.load(args.config)
    return preset(args.preset or DEFAULT_PRESET)


def given_model_config(args: argparse.Namespace) -> tuple[ModelConfig | None, str]:
    """The model config a --config/--preset flag names (None: neither given) and the flag, in words."""
    if args.config is None and args.preset is None:
        return None, ""
    what = f"--config {args.config}" if args.config is not None else f"--preset {args.preset}"
    return build_model_config(args), what


def shared_tokenizer(run_dir: Path, vocab_size: int, data: str | None) -> Tokenizer:
    """Train the run's BPE once: on rank 0, which hands it to the other ranks through ``run_dir``."""
    pending = run_dir / ".tokenizer-pending.json"
    if is_rank0():
        print(f"training a {vocab_size}-token byte-level BPE on the corpus ...", file=sys.stderr)
        tok = train_tokenizer(vocab_size, data)
        if world_size() > 1:
            run_dir.mkdir(parents=True, exist_ok=True)
            tok.save(pending)
    barrier()
    if not is_rank0():
        tok = Tokenizer.from_file(pending)
    barrier()
    if is_rank0() and world_size() > 1:
        pending.unlink()
    return tok


def parallel_dims(args: argparse.Namespace) -> ParallelDims | None:
    """The layout the flags ask for (None: none given, the train config decides)."""
    if args.dp_shard is None and args.ep is None and args.cp is None:
        return None
    return ParallelDims.for_world(world_size(), args.dp_shard, args.ep or 1, args.cp or 1)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    launch = {"progress": not args.no_progress, "max_steps": args.max_steps, "dims": parallel_dims(args)}
    try:
        if args.resume:
            check_resumable(args.run_dir, ckpt.CONFIG_FILE, *given_model_config(args))
            trainer = Trainer(args.run_dir, resume=True, device=args.device, **launch)
        else:
            mcfg, tcfg = build_model_config(args), build_train_config(args)
            tok = args.tokenizer and Tokenizer.from_file(args.tokenizer)
            make_tok = lambda: shared_tokenizer(args.run_dir, mcfg.vocab_size, tcfg.data)  # noqa: E731
            trainer = Trainer(args.run_dir, mcfg, tcfg, tok or make_tok, device=args.device, **launch)
        summary = trainer.fit()
    except UserError:
        raise
    except ValueError as e:  # validation below the config layer (data mixes, packing) raises ValueError
        raise UserError(str(e)) from e
    finally:
        teardown()
    if not is_rank0():
        return 0
    if not args.no_plots:
        render(args.run_dir)
    print(json.dumps(summary))
    return 0
