"""The trainer's side of scale-out: the run's parallel layout and each rank's share of every batch.

Every rank runs the same curriculum (same seed, same packers), so all ranks hold the same global batch
and the same data position: a checkpoint's data state does not depend on the world size, and a run
resumed on another number of processes continues with the same batches. Each data rank then keeps
its own windows of the batch (``shard_batch``): windows are dealt to ranks balancing tokens, so the
union over ranks is exactly the one-process batch. The loss is weighted by each rank's share of the
batch's target tokens (``token_weight``), so the gradient that FSDP averages over ranks equals the
one-process gradient of the mean loss over the whole batch. Under context parallelism the ``cp`` ranks
of a data rank share its windows and each takes a contiguous part of the packed row
(``context_part``); the model gets the row's global ``cu_seqlens`` and splits the recurrences itself.

Without ``torchrun`` the layout is one process, nothing is sharded and the trainer runs unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from longmoe.config import ConfigError
from longmoe.data.stages import CurriculumStage
from longmoe.distributed.parallel_dims import (
    ParallelDims,
    data_rank,
    init_distributed,
    is_distributed,
    world_size,
)
from longmoe.train.config import TrainConfig

log = logging.getLogger(__name__)


@dataclass
class ParallelRun:
    """This process's place in the run: layout, mesh (None when single-process) and device."""

    dims: ParallelDims
    mesh: DeviceMesh | None
    device: torch.device

    @property
    def enabled(self) -> bool:
        """True under ``torchrun`` (even with one rank: FSDP over a 1-rank mesh)."""
        return self.mesh is not None

    @property
    def data_rank(self) -> int:
        return 0 if self.mesh is None else data_rank(self.mesh)

    @property
    def cp_rank(self) -> int:
        return 0 if self.mesh is None else self.mesh["cp"].get_local_rank()

    @property
    def data_degree(self) -> int:
        return self.dims.data_degree

    @property
    def world(self) -> int:
        return self.dims.world_size


def start_run(tcfg: TrainConfig, device: str = "cpu", dims: ParallelDims | None = None) -> ParallelRun:
    """Join the process group if launched by ``torchrun`` and build the layout.

    ``dims`` (the command-line flags) wins; else the train config's degrees when they fit the world;
    else every rank is data-parallel (a run resumed on another world size keeps working: DCP reshards).
    """
    dev = init_distributed(device)
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
    mesh = dims.build_mesh(dev) if is_distributed() else None
    return ParallelRun(dims, mesh, dev)


def window_lengths(stage: CurriculumStage) -> list[int]:
    """Lengths of the windows of one batch of ``stage``, in batch order (long ones, then replay)."""
    return [stage.window] * stage.batch_size + [stage.replay_window] * stage.n_replay


def check_batches(stages: list[CurriculumStage], parts: int) -> None:
    """Every batch must have at least one window per data rank."""
    for i, s in enumerate(stages):
        n = len(window_lengths(s))
        if n < parts:
            raise ConfigError(
                f"stages[{i}] ({s.name}): a batch has {n} windows (batch_size {s.batch_size} + "
                f"{s.n_replay} replay) but there are {parts} data-parallel ranks (dp_shard × ep): "
                f"expected at least one window per rank"
            )


def assign_windows(lengths: list[int], parts: int) -> list[list[int]]:
    """Deal window indices to ``parts`` ranks balancing tokens (longest first to the least-loaded rank,
    ties to the lowest rank); each rank's windows stay in batch order. Deterministic."""
    load, out = [0] * parts, [[] for _ in range(parts)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(parts), key=lambda r: (load[r], len(out[r]), r))
        out[r].append(i)
        load[r] += lengths[i]
    return [sorted(o) for o in out]


def shard_batch(batch: dict[str, Any], lengths: list[int], part: int, parts: int) -> dict[str, Any]:
    """The windows of packed ``batch`` (``input_ids``/``labels [1, N]``, ``cu_seqlens``) that rank
    ``part`` of ``parts`` trains on, re-packed with their own ``cu_seqlens``."""
    if parts == 1:
        return batch
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    cu = batch["cu_seqlens"].tolist()
    ids, labels, offsets = [], [], [0]
    for w in assign_windows(lengths, parts)[part]:
        a, b = starts[w], starts[w + 1]
        ids.append(batch["input_ids"][:, a:b])
        labels.append(batch["labels"][:, a:b])
        base = offsets[-1]
        offsets += [base + c - a for c in cu if a < c <= b]  # segments never cross a window edge
    out = dict(batch)
    out.update(
        input_ids=torch.cat(ids, 1),  # [1, n]
        labels=torch.cat(labels, 1),  # [1, n]
        cu_seqlens=torch.tensor(offsets, dtype=batch["cu_seqlens"].dtype),
    )
    return out


def context_part(batch: dict[str, Any], part: int, parts: int) -> dict[str, Any]:
    """Part ``part`` of ``parts`` equal contiguous parts of the packed row (``input_ids``/``labels``);
    ``cu_seqlens`` stay the whole row's (context parallel takes global offsets)."""
    if parts == 1:
        return batch
    n = batch["input_ids"].shape[1]
    if n % parts:
        raise ConfigError(
            f"context parallel: a rank's packed row has {n} tokens, not divisible by --cp {parts}: "
            "choose window lengths (and replay windows) that are multiples of the cp degree"
        )
    t = n // parts
    out = dict(batch)
    out.update(
        input_ids=batch["input_ids"][:, part * t : (part + 1) * t],  # [1, n / parts]
        labels=batch["labels"][:, part * t : (part + 1) * t],
    )
    return out


def batch_to(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with its tensors on ``device`` (the same dict when already there)."""
    if device.type == "cpu":
        return batch
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
