"""Sharded model + optimizer state through ``torch.distributed.checkpoint`` (DCP), loadable at any world size.

A sharded checkpoint directory holds ``dcp/``: one file per rank with its shards plus DCP's
``.metadata`` (written by rank 0 once every rank has written). Keys are parameter names (FQNs), not
ranks or positions, so DCP reshards on load: a checkpoint saved by 2 ranks loads into 1 process (no
process group needed) or into 4 ranks. A single-process checkpoint (``model.safetensors`` + the
optimizer's own ``state_dict``) loads into a sharded model through ``load_full``.

The atomic layout around it (temporary directory, manifest, rename) is the trainer's checkpoint
module's; these functions only read and write the model and optimizer state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from longmoe.distributed.parallel_dims import is_rank0

DCP_DIR = "dcp"
DCP_METADATA = ".metadata"


def is_sharded_checkpoint(path: Path) -> bool:
    """True when ``path`` holds a DCP checkpoint (``dcp/.metadata``)."""
    return (Path(path) / DCP_DIR / DCP_METADATA).is_file()


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
