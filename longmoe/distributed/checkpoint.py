"""Sharded model + optimizer state through ``torch.distributed.checkpoint`` (DCP), loadable at any world size.

A sharded checkpoint directory holds ``dcp/``: one file per rank with its shards plus DCP's
``.metadata`` (written by rank 0 once every rank has written). Keys are parameter names (FQNs), not
ranks or positions, so DCP reshards on load: a checkpoint saved by 2 ranks loads into 1 process (no
process group needed) or into 4 ranks. A single-process checkpoint (``model.safetensors`` + the
optimizer's own ``state_dict``) loads into a sharded model through ``load_full``.

``save_sharded_checkpoint`` wraps it in the run's atomic checkpoint protocol (``longmoe.checkpoint``):
rank 0 prepares a temporary directory every rank agrees on, all ranks write their shards, and rank 0
adds the config, tokenizer and trainer state, then seals it (manifest, fsync, rename) while the others
wait, so a process killed at any point leaves the previous checkpoints as they were.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from longmoe import checkpoint as ckpt
from longmoe.config import ModelConfig
from longmoe.distributed.parallel_dims import barrier, is_rank0
from longmoe.model import CONFIG_FILE, WEIGHTS_FILE

DCP_DIR = ckpt.SHARDED_DIR
WEIGHTS_META = {"format": "pt", "longmoe": "1"}  # as LongMoE.save_pretrained writes
SHARED_TMP_TAG = "sharded"  # the temporary directory's suffix: the same name on every rank


def save_sharded_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: ModelConfig,
    tokenizer_file: Path,
    state: dict[str, Any],
    keep_last: int,
) -> Path:
    """Checkpoint ``step`` of a sharded run, atomically (a collective: every rank calls it)."""
    tmp = ckpt.tmp_dir(run_dir, step, SHARED_TMP_TAG)
    if is_rank0():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    save_sharded(model, optimizer, tmp)
    barrier()  # every rank's shards are on disk
    if is_rank0():
        cfg.save(tmp / CONFIG_FILE)
        shutil.copyfile(tokenizer_file, tmp / ckpt.TOKENIZER_FILE)
        torch.save(state, tmp / ckpt.STATE_FILE)
        ckpt.finalize(tmp, run_dir, step, keep_last)
    barrier()  # nobody moves on (or exits) before the checkpoint is complete
    return ckpt.step_dir(run_dir, step)


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Every rank writes its shards of the model and optimizer into ``path/dcp`` (a collective)."""
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=Path(path) / DCP_DIR)


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Load ``path/dcp`` into ``model`` and ``optimizer`` (sharded or not), resharding as needed."""
    msd, osd = get_state_dict(model, optimizer)  # the target layout; initialises the optimizer's state
    sd: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=Path(path) / DCP_DIR)
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def load_full(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
) -> None:
    """Load a one-process checkpoint (full tensors; optimizer state keyed by position) into a sharded
    ``model`` and ``optimizer``; every rank passes the same full state and keeps its own shards."""
    set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
    names = {p: n for n, p in model.named_parameters()}
    fqn = [names[p] for g in optimizer.param_groups for p in g["params"]]  # position -> name
    by_name = {
        "state": {fqn[int(i)]: s for i, s in optim_state["state"].items()},
        "param_groups": [
            {**g, "params": [fqn[int(i)] for i in g["params"]]} for g in optim_state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on CPU, gathered on rank 0 (a collective; other ranks get ``{}``)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=opts)
    return sd if is_rank0() else {}


def export_model(model: nn.Module, cfg: ModelConfig, path: Path, tokenizer_file: Path) -> Path:
    """Write the whole model as a plain model directory at ``path`` (atomically; a collective: the
    weights are gathered to rank 0, which writes them). Loadable by ``LongMoE.from_pretrained``."""
    sd = full_model_state(model)
    if is_rank0():
        tmp = path.with_name(f".tmp-{path.name}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        cfg.save(tmp / CONFIG_FILE)
        shutil.copyfile(tokenizer_file, tmp / ckpt.TOKENIZER_FILE)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / WEIGHTS_FILE), metadata=WEIGHTS_META)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    barrier()
    return path
