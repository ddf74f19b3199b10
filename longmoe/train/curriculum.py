"""The context curriculum as a data stream: which stage we are in, and its packed batches.

Each batch of stage ``s`` holds ``batch_size`` long windows from the stage's mix followed by
``n_replay`` short windows from the replay mix (long and short sequences in one batch), flattened into
one packed row with ``cu_seqlens``. Packers are shared between stages that use the same mix (and, for
synthetic sources, the same length), so replaying short-window data in stage 3 continues the stage-1
stream instead of repeating it. The whole position (stage, batch within stage, every packer) is a
plain dict that goes into the checkpoint.

With a ``vision`` config the packers read interleaved image-text documents (``data/packing.py``) and a
batch carries the ``images`` of its windows.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from longmoe.config import VisionConfig
from longmoe.data.batch import Batch
from longmoe.data.images import ImageLoader
from longmoe.data.packing import Packer, collate
from longmoe.data.stages import CurriculumStage
from longmoe.data.tokenizer import Tokenizer
from longmoe.train.mix import make_mix


def _mix_key(
    mix: dict[str, float],
    length: int,
    synthetic_loss: str = "all",
    synthetic_range: list[float] | None = None,
) -> str:
    synth = any(k.startswith("synthetic") for k in mix)
    key: dict[str, Any] = {"mix": dict(sorted(mix.items())), "len": length if synth else None}
    # defaults add nothing, so the keys (and data order) of existing checkpoints stay the same
    if synth and synthetic_loss != "all":
        key["loss"] = synthetic_loss
    if synth and synthetic_range is not None:
        key["range"] = [float(x) for x in synthetic_range]
    return json.dumps(key)


class Curriculum:
    """Stage bookkeeping + batch production for a list of ``CurriculumStage``."""

    def __init__(
        self,
        stages: list[CurriculumStage],
        tokenizer: Tokenizer,
        seed: int = 0,
        data: str | Path | None = None,
        split: str = "train",
        vision: VisionConfig | None = None,
    ) -> None:
        self.stages, self.tok, self.seed, self.data, self.split = stages, tokenizer, seed, data, split
        self.images = None if vision is None else ImageLoader(vision, tokenizer)
        self.stage_idx, self.batch_in_stage = 0, 0
        self._packers: dict[str, Packer] = {}
        self._saved: dict[str, Any] = {}  # restored states of packers not built yet

    # ------------------------------------------------------------------ position
    @property
    def done(self) -> bool:
        return self.stage_idx >= len(self.stages)

    @property
    def stage(self) -> CurriculumStage:
        return self.stages[min(self.stage_idx, len(self.stages) - 1)]

    def stage_at(self, batch: int) -> int:
        """Stage index of global batch number ``batch``."""
        for i, s in enumerate(self.stages):
            if batch < s.steps:
                return i
            batch -= s.steps
        return len(self.stages)

    def packer(
        self,
        mix: dict[str, float],
        length: int,
        synthetic_loss: str = "all",
        synthetic_range: list[float] | None = None,
    ) -> Packer:
        key = _mix_key(mix, length, synthetic_loss, synthetic_range)
        if key not in self._packers:
            src = make_mix(
                mix,
                self.split,
                self.seed + zlib.crc32(key.encode()) % 100_000,
                self.tok,
                self.data,
                synthetic_length=length,
                synthetic_loss=synthetic_loss,
                synthetic_range=tuple(synthetic_range) if synthetic_range is not None else None,
            )
            p = Packer(src, self.tok.encode, self.tok.bos_id, self.tok.eos_id, self.images)
            if key in self._saved:
                p.restore(self._saved.pop(key))
            self._packers[key] = p
        return self._packers[key]

    # ------------------------------------------------------------------ batches
    def next_batch(self) -> Batch:
        """The next packed batch; advances to the next stage when the current one's budget is spent."""
        if self.done:
            raise StopIteration("curriculum finished")
        s = self.stage
        main = self.packer(s.mix, s.window, s.synthetic_loss, s.synthetic_length)
        windows = [main.next_window(s.window) for _ in range(s.batch_size)]
        if s.n_replay:
            rep = self.packer(s.replay_mix, s.replay_window, s.synthetic_loss, s.synthetic_length)
            windows += [rep.next_window(s.replay_window) for _ in range(s.n_replay)]
        batch = collate(windows).replace(stage=self.stage_idx, stage_name=s.name, window=s.window)
        self.batch_in_stage += 1
        if self.batch_in_stage >= s.steps:
            self.stage_idx, self.batch_in_stage = self.stage_idx + 1, 0
        return batch

    # a checkpoint part (``train/checkpointer.py``)
    def state_dict(self) -> dict[str, Any]:
        packers = dict(self._saved)
        packers.update({k: p.state() for k, p in self._packers.items()})
        return {"stage": self.stage_idx, "batch_in_stage": self.batch_in_stage, "packers": packers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stage_idx, self.batch_in_stage = int(state["stage"]), int(state["batch_in_stage"])
        self._packers, self._saved = {}, dict(state["packers"])


def val_batches(
    tokenizer: Tokenizer,
    length: int,
    n_windows: int,
    mix: dict[str, float] | None = None,
    data: str | Path | None = None,
    seed: int = 1234,
    vision: VisionConfig | None = None,
) -> list[Batch]:
    """Fixed validation data: the first ``n_windows`` windows of ``length`` from the val split, one packed
    batch each (scored separately so attention memory stays O(length²), not O((n·length)²))."""
    src = make_mix(mix or {"file": 1.0}, "val", seed, tokenizer, data, synthetic_length=length)
    images = None if vision is None else ImageLoader(vision, tokenizer)
    p = Packer(src, tokenizer.encode, tokenizer.bos_id, tokenizer.eos_id, images)
    return [collate([p.next_window(length)]) for _ in range(n_windows)]
