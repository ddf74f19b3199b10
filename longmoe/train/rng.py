"""Seeding and the RNG state a checkpoint holds, so a resumed run draws the same numbers as one that
never stopped (torch's CPU generator and Python's ``random``)."""

from __future__ import annotations

import random
from typing import Any

import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuple(state["python"]))


def _as_tuple(x: Any) -> Any:
    """Python's RNG state is nested tuples; a checkpoint may hand it back as lists."""
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
