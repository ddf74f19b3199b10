"""How a training loop runs on its processes: one ``Strategy`` object, so the loop has no branches on it.

``SingleProcess`` is the plain run. ``Sharded`` (under ``torchrun``, even with one rank) wraps what
``longmoe.distributed`` does (FSDP2, expert and context parallelism over a ``ParallelDims`` mesh,
cross-rank reductions, DCP checkpoints) behind the same methods:

- ``wrap(model)``: the parallelisms around an unchanged model (nothing in one process);
- ``local(batch)``: this rank's windows of the global batch, on its device (``train/sharding.py``);
- ``loss(out, labels)``: the loss to back-propagate and this rank's share of the logged CE / aux loss,
  weighted so that FSDP's mean over ranks is the one-process gradient;
- ``reduce(values)``, ``clip_grad_norm(params, clip)``: sums and the gradient norm over every rank;
- ``save(...)`` / ``load(...)`` / ``export(...)``: model + optimizer into a checkpoint (``model.safetensors``
  + the optimizer's state dict, or DCP shards resumable at another world size) and the final model.

``build_strategy`` is the one place a process joins the ``torchrun`` group (``init_distributed``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from longmoe import checkpoint as ckpt
from longmoe.config import IGNORE_INDEX, ConfigError, ModelConfig
from longmoe.data.batch import Batch
from longmoe.data.tokenizer import Tokenizer
from longmoe.distributed import checkpoint as dcp_ckpt
from longmoe.distributed.parallel_dims import (
    ParallelDims,
    data_rank,
    init_distributed,
    is_distributed,
    world_size,
)
from longmoe.distributed.parallelize import parallelize
from longmoe.distributed.reduce import all_reduce_sum, clip_grad_norm_, sync_balance_stats
from longmoe.model import WEIGHTS_FILE, LongMoE, ModelOutput
from longmoe.train.config import TrainConfig
from longmoe.train.sharding import batch_to, check_batches, context_part, shard_batch

log = logging.getLogger(__name__)

ScalarShares = tuple[float, float, torch.Tensor]  # (CE share, aux share, loss to back-propagate)


def join(device: str | torch.device = "cpu") -> torch.device:
    """Join the ``torchrun`` group when launched by it (idempotent); returns this rank's device."""
    return init_distributed(device)


class SingleProcess:
    """One process: everything local, checkpoints as a plain model directory + optimizer state."""

    def __init__(self, dims: ParallelDims, device: torch.device) -> None:
        self.dims, self.device = dims, device

    data_rank = 0
    cp_rank = 0

    @property
    def data_degree(self) -> int:
        return 1

    @property
    def world(self) -> int:
        return 1

    def wrap(self, model: LongMoE, activation_checkpointing: bool = False) -> LongMoE:
        return model

    def check_images(self, batch: Batch) -> None:
        """Image documents train here (one process)."""

    def local(self, batch: Batch) -> Batch:
        return batch_to(batch, self.device)

    def eval_part(self, batch: Batch) -> Batch:
        return batch_to(batch, self.device)

    def loss(self, out: ModelOutput, labels: torch.Tensor) -> ScalarShares:
        return float(out.ce_loss.detach()), float(out.aux_loss.detach()), out.loss

    def reduce(self, values: list[float]) -> list[float]:
        return list(values)

    def clip_grad_norm(self, params: Any, clip: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, clip))

    def sync_balance(self, model: LongMoE) -> None:
        """Nothing to sum: this process saw the whole batch."""

    def save(
        self, run_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer, cfg: ModelConfig,
        tokenizer_file: Path | None, state: dict[str, Any], keep_last: int,
    ) -> Path:  # fmt: skip
        state = {**state, "optimizer": opt.state_dict()}
        return ckpt.save_checkpoint(run_dir, step, model, tokenizer_file, state, keep_last)

    def load(self, path: Path, state: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if ckpt.is_sharded(path):  # written by several processes: DCP reshards to one
            dcp_ckpt.load_sharded(model, opt, path)
            return
        ckpt.load_weights(model, path)
        opt.load_state_dict(state["optimizer"])

    def export(self, model: nn.Module, cfg: ModelConfig, path: Path, tok: Tokenizer, tok_file: Path) -> Path:
        return ckpt.save_model_dir(path, model, tok)


class Sharded(SingleProcess):
    """Several processes (or one under ``torchrun``): FSDP2 / EP / CP over ``mesh``."""

    def __init__(self, dims: ParallelDims, device: torch.device, mesh: DeviceMesh) -> None:
        super().__init__(dims, device)
        self.mesh = mesh

    @property
    def data_rank(self) -> int:  # type: ignore[override]
        return data_rank(self.mesh)

    @property
    def cp_rank(self) -> int:  # type: ignore[override]
        return self.mesh["cp"].get_local_rank()

    @property
    def data_degree(self) -> int:
        return self.dims.data_degree

    @property
    def world(self) -> int:
        return self.dims.world_size

    def wrap(self, model: LongMoE, activation_checkpointing: bool = False) -> LongMoE:
        parallelize(model, self.dims, self.mesh, activation_checkpointing)
        return model

    def check_images(self, batch: Batch) -> None:
        """Refuse images on the global batch (the same on every rank, so every rank stops: a rank that
        went on would wait for the others in a collective)."""
        if batch.images:
            raise ConfigError(
                "image documents train in one process only: under torchrun the vision encoder's "
                "gradients would be reduced only on ranks whose windows hold images, and context "
                "parallelism would cut image spans (run without torchrun)"
            )

    def local(self, batch: Batch) -> Batch:
        """This rank's windows of the global ``batch``, its part of the row under CP, on its device."""
        mine = shard_batch(batch, window_lengths_of(batch), self.data_rank, self.data_degree)
        return batch_to(context_part(mine, self.cp_rank, self.dims.cp), self.device)

    def eval_part(self, batch: Batch) -> Batch:
        return batch_to(context_part(batch, self.cp_rank, self.dims.cp), self.device)

    def loss(self, out: ModelOutput, labels: torch.Tensor) -> ScalarShares:
        """This rank's CE weighted by its share of the global batch's targets (× ranks, which FSDP
        divides back out); the aux loss averaged. The CE and aux shares sum to the global values."""
        n_local = int((labels != IGNORE_INDEX).sum())
        (n_all,) = all_reduce_sum([float(n_local)])
        w = self.world
        if n_local == 0:  # no targets here (CE is NaN): a zero loss that still runs every backward hook
            ce_term, ce_share = out.logits.float().sum() * 0.0, 0.0
        else:
            ce_term = out.ce_loss * (n_local * w / n_all)
            ce_share = float(out.ce_loss.detach()) * n_local / n_all
        return ce_share, float(out.aux_loss.detach()) / w, ce_term + out.aux_loss

    def reduce(self, values: list[float]) -> list[float]:
        return all_reduce_sum(values)

    def clip_grad_norm(self, params: Any, clip: float) -> float:
        return clip_grad_norm_(params, clip)  # the norm over every rank's gradient shards

    def sync_balance(self, model: LongMoE) -> None:
        sync_balance_stats(model.moe_layers())  # every rank folds the global load

    def save(
        self, run_dir: Path, step: int, model: nn.Module, opt: torch.optim.Optimizer, cfg: ModelConfig,
        tokenizer_file: Path | None, state: dict[str, Any], keep_last: int,
    ) -> Path:  # fmt: skip
        if tokenizer_file is None:
            raise ValueError("a sharded checkpoint needs the run's tokenizer (token-id models: one process)")
        return dcp_ckpt.save_sharded_checkpoint(
            run_dir, step, model, opt, cfg, tokenizer_file, state, keep_last
        )

    def load(self, path: Path, state: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer) -> None:
        if ckpt.is_sharded(path):
            dcp_ckpt.load_sharded(model, opt, path)
        else:  # a one-process checkpoint, resumed by several
            dcp_ckpt.load_full(model, opt, load_file(str(path / WEIGHTS_FILE)), state["optimizer"])

    def export(self, model: nn.Module, cfg: ModelConfig, path: Path, tok: Tokenizer, tok_file: Path) -> Path:
        return dcp_ckpt.export_model(model, cfg, path, tok_file)


Strategy = SingleProcess | Sharded


def window_lengths_of(batch: Batch) -> list[int]:
    """The lengths of the windows a curriculum batch was packed from (in batch order)."""
    if batch.window_lengths is None:
        raise ValueError("a sharded step needs the batch's window lengths (a curriculum batch has them)")
    return list(batch.window_lengths)


def build_strategy(tcfg: TrainConfig, device: str = "cpu", dims: ParallelDims | None = None) -> Strategy:
    """Join the process group if launched by ``torchrun`` and build the layout.

    ``dims`` (the command-line flags) wins; else the train config's degrees when they fit the world;
    else every rank is data-parallel (a run resumed on another world size keeps working: DCP reshards).
    """
    dev = join(device)
    world = world_size()
    if dims is None:
        try:
            dims = ParallelDims.for_world(world, tcfg.dp_shard, tcfg.ep, tcfg.cp)
        except ConfigError:
            if tcfg.dp_shard is None and tcfg.ep == 1 and tcfg.cp == 1:
                raise
            dims = ParallelDims.for_world(world)
            log.info("train config layout does not fit %d processes; using %s", world, dims.describe())
    dims.validate(world)
    check_batches(tcfg.stages, dims.data_degree)
    if not is_distributed():
        return SingleProcess(dims, dev)
    return Sharded(dims, dev, dims.build_mesh(dev))
