"""One checkpointer over the parts of a training run, each saving and loading its own state.

A loop hands the ``Checkpointer`` its model and optimizer (stored by the ``Strategy``: a model
directory + the optimizer's state dict in one process, DCP shards under ``torchrun``), its ``Progress``
(step, tokens, skipped steps: the top level of the state file) and named parts with
``state_dict()`` / ``load_state_dict()``: the LR schedule, the data stream, the RNG, the RL reference
fingerprint, a recipe's curve (``Curve``), a data generator (``GeneratorState``), a module trained beside
the model (``ModuleState``). MoE balancer state (bias, load window, step counts) is persistent
buffers of the model, so it travels with the weights.

On disk it is the run layout of ``longmoe.checkpoint`` (atomic ``checkpoints/step-N/`` with a hash
manifest), whose ``trainer_state.pt`` holds::

    {"format_version": 2, "step": ..., "tokens": ..., "skipped_steps": ..., "<part>": {...}, ...,
     "optimizer": {...}}          # the optimizer only in one-process checkpoints (else in dcp/)

Format 1 is what every loop wrote before this module (no ``format_version``): the same keys without
``schedule`` (its position was the step) and without the RL reference fingerprint; it still resumes.
A newer format is refused with one line naming it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from longmoe import checkpoint as ckpt
from longmoe.config import ModelConfig
from longmoe.train.parallel import Strategy
from longmoe.train.rng import rng_state, set_rng_state
from longmoe.train.run import check_checkpoint_config

log = logging.getLogger(__name__)

FORMAT_KEY = "format_version"
FORMAT_VERSION = 2
LEGACY_FORMAT = 1  # trainer_state.pt without a version key (written before the checkpointer)
RESERVED = ("step", "tokens", "skipped_steps", "optimizer", FORMAT_KEY)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Progress:
    """How far a run is: optimizer steps taken, tokens trained on, steps skipped for bad gradients."""

    step: int = 0
    tokens: int = 0
    skipped_steps: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.tokens = int(state.get("tokens", 0))  # format 1 RL checkpoints have no token count
        self.skipped_steps = int(state.get("skipped_steps", 0))


class RNG:
    """Torch's CPU generator and Python's ``random``, as of the save."""

    def state_dict(self) -> dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state)


class Curve:
    """A recipe's training curve so far (rows of numbers), the wall seconds and the CPU seconds (this
    process's, all threads) it took: a resumed run's times add to the earlier runs'."""

    def __init__(self) -> None:
        self.points: list[list[float]] = []
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def cpu_seconds(self) -> float:
        return time.process_time() - self.c0

    def state_dict(self) -> dict[str, Any]:
        return {"curve": self.points, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = [list(p) for p in state["curve"]]
        self.t0 = time.perf_counter() - float(state["seconds"])
        self.c0 = time.process_time() - float(state.get("cpu_seconds", 0.0))  # absent: saved before


class GeneratorState:
    """A ``torch.Generator`` a loop draws its data from (e.g. random windows), at its position."""

    def __init__(self, gen: torch.Generator) -> None:
        self.gen = gen

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.gen.set_state(state["state"])


class ModuleState:
    """A module trained beside the model but not part of it (e.g. a recipe's control layer)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state)


def format_of(state: dict[str, Any], path: Path) -> int:
    """The checkpoint's format version; a one-line ``CheckpointError`` for one this code cannot read."""
    v = state.get(FORMAT_KEY, LEGACY_FORMAT)
    if not isinstance(v, int) or isinstance(v, bool) or not LEGACY_FORMAT <= v <= FORMAT_VERSION:
        raise ckpt.CheckpointError(
            f"checkpoint {path} has {ckpt.STATE_FILE} {FORMAT_KEY} {v!r}; this longmoe reads formats "
            f"{LEGACY_FORMAT}-{FORMAT_VERSION}: resume it with the longmoe that wrote it, or start a new run"
        )
    return v


def upgrade(state: dict[str, Any], version: int) -> dict[str, Any]:
    """A format-1 state in format-2 terms: the schedule's position was the step."""
    if version == LEGACY_FORMAT:
        state = {**state, "schedule": {"step": int(state["step"])}}
    return state


class Checkpointer:
    """Saves and restores every part of one run (a collective under ``torchrun``: all ranks call it)."""

    def __init__(
        self,
        run_dir: str | Path,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        strategy: Strategy,
        model_cfg: ModelConfig,
        tokenizer_file: Path | None,
        progress: Progress,
        parts: dict[str, Stateful],
        keep_last: int,
    ) -> None:
        clash = set(parts) & set(RESERVED)
        if clash:
            raise ValueError(f"checkpoint part names {sorted(clash)} are reserved")
        self.run_dir, self.model, self.opt, self.strategy = Path(run_dir), model, optimizer, strategy
        self.cfg, self.tokenizer_file, self.progress = model_cfg, tokenizer_file, progress
        self.parts, self.keep_last = parts, keep_last

    def state(self) -> dict[str, Any]:
        """What ``trainer_state.pt`` holds besides the model and optimizer."""
        out: dict[str, Any] = {FORMAT_KEY: FORMAT_VERSION, **self.progress.state_dict()}
        out.update({name: part.state_dict() for name, part in self.parts.items()})
        return out

    def save(self) -> Path:
        """Checkpoint ``progress.step`` atomically; keep the newest ``keep_last``."""
        return self.strategy.save(
            self.run_dir, self.progress.step, self.model, self.opt, self.cfg, self.tokenizer_file,
            self.state(), self.keep_last,
        )  # fmt: skip

    def restore(self) -> Path | None:
        """Load the newest complete checkpoint into every part; None (nothing changed) if there is none."""
        found = ckpt.load_latest(self.run_dir)
        if found is None:
            return None
        path, state = found
        version = format_of(state, path)
        check_checkpoint_config(path, self.cfg, self.run_dir)
        state = upgrade(state, version)
        self.strategy.load(path, state, self.model, self.opt)
        self.progress.load_state_dict(state)
        for name, part in self.parts.items():
            if name in state:
                part.load_state_dict(state[name])
            elif version == LEGACY_FORMAT:
                log.info("checkpoint %s (format %d) has no %r part; it starts fresh", path, version, name)
            else:
                raise ckpt.CheckpointError(f"checkpoint {path}: {ckpt.STATE_FILE} lacks its {name!r} part")
        log.info(
            "resumed %s at step %d (%s, format %d)", self.run_dir, self.progress.step, path.name, version
        )
        return path
