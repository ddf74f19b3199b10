"""``Batch``: what the data stream hands the training step, typed (tensors and where they came from).

One packed row (``B = 1``) of windows: the token ids, the next-token targets, the segment offsets the
recurrences and attention reset at, the images whose patch embeddings fill the row's image spans, and
the bookkeeping a step logs (curriculum stage and window) or shards by (``window_lengths``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from longmoe.types import Patches


@dataclass
class Batch:
    input_ids: torch.Tensor  # [1, N] long
    labels: torch.Tensor  # [1, N] long, IGNORE_INDEX where no target
    cu_seqlens: torch.Tensor  # [S+1] int32: segment offsets over the whole row
    images: list[Patches] = field(default_factory=list)  # in row order (LongMoE.encode_images)
    window_lengths: tuple[int, ...] | None = None  # the packed windows' lengths, in row order
    stage: int = 0  # curriculum stage index the batch belongs to
    stage_name: str = ""
    window: int = 0  # the stage's long-window length
    n_demos: int = 0  # SFT: demonstrations at the front of the row

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.numel())

    def replace(self, **changes: object) -> Batch:
        return dataclasses.replace(self, **changes)

    def to(self, device: torch.device | str) -> Batch:
        """The batch with its tensors on ``device`` (itself when they are there already)."""
        if self.input_ids.device == torch.device(device):
            return self
        return self.replace(
            input_ids=self.input_ids.to(device),
            labels=self.labels.to(device),
            cu_seqlens=self.cu_seqlens.to(device),
        )
