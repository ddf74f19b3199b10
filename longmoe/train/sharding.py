"""The trainer's side of scale-out: each rank's share of every batch.

Every rank runs the same curriculum (same seed, same packers), so all ranks hold the same global batch
and the same data position: a checkpoint's data state does not depend on the world size, and a run
resumed on another number of processes continues with the same batches. Each data rank then keeps
its own windows of the batch (``shard_batch``): windows are dealt to ranks balancing tokens, so the
union over ranks is exactly the one-process batch. The loss is weighted by each rank's share of the
batch's target tokens (``token_weight``), so the gradient that FSDP averages over ranks equals the
one-process gradient of the mean loss over the whole batch. Under context parallelism the ``cp`` ranks
of a data rank share its windows and each takes a contiguous part of the packed row
(``context_part``); the model gets the row's global ``cu_seqlens`` and splits the recurrences itself.

The strategy object that applies these per rank is ``train/parallel.py``.
"""

from __future__ import annotations

import torch

from longmoe.config import ConfigError
from longmoe.data.batch import Batch
from longmoe.data.stages import CurriculumStage


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


def shard_batch(batch: Batch, lengths: list[int], part: int, parts: int) -> Batch:
    """The windows of packed ``batch`` (``input_ids``/``labels [1, N]``, ``cu_seqlens``) that rank
    ``part`` of ``parts`` trains on, re-packed with their own ``cu_seqlens``."""
    if parts == 1:
        return batch
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    cu = batch.cu_seqlens.tolist()
    ids, labels, offsets = [], [], [0]
    mine = assign_windows(lengths, parts)[part]
    for w in mine:
        a, b = starts[w], starts[w + 1]
        ids.append(batch.input_ids[:, a:b])
        labels.append(batch.labels[:, a:b])
        base = offsets[-1]
        offsets += [base + c - a for c in cu if a < c <= b]  # segments never cross a window edge
    return batch.replace(
        input_ids=torch.cat(ids, 1),  # [1, n]
        labels=torch.cat(labels, 1),  # [1, n]
        cu_seqlens=torch.tensor(offsets, dtype=batch.cu_seqlens.dtype),
        window_lengths=tuple(lengths[w] for w in mine),
    )


def context_part(batch: Batch, part: int, parts: int) -> Batch:
    """Part ``part`` of ``parts`` equal contiguous parts of the packed row (``input_ids``/``labels``);
    ``cu_seqlens`` stay the whole row's (context parallel takes global offsets)."""
    if parts == 1:
        return batch
    n = batch.input_ids.shape[1]
    if n % parts:
        raise ConfigError(
            f"context parallel: a rank's packed row has {n} tokens, not divisible by --cp {parts}: "
            "choose window lengths (and replay windows) that are multiples of the cp degree"
        )
    t = n // parts
    return batch.replace(
        input_ids=batch.input_ids[:, part * t : (part + 1) * t],  # [1, n / parts]
        labels=batch.labels[:, part * t : (part + 1) * t],
    )


def batch_to(batch: Batch, device: torch.device) -> Batch:
    """``batch`` with its tensors on ``device`` (the same batch when already there)."""
    return batch if device.type == "cpu" else batch.to(device)
