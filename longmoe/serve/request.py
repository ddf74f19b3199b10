"""A request inside the engine and what it gives back: its state, per-token events, the result.

``Request`` is the engine's record of one submission (prompt, sampling state, its cache while
prefilling, output so far, text and how much of it was sent); ``Event`` is what the request's sink
receives after each token and ``Completion`` the final result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from longmoe.cache import Cache
from longmoe.serve.detok import IncrementalDetokenizer
from longmoe.serve.sampling import SamplerState, SamplingParams

FINISH_REASONS = ("stop", "length", "cancelled", "error")


class EngineError(ValueError):
    """A request the engine cannot take; ``param`` names the offending field."""

    def __init__(self, param: str, message: str, status: int = 400) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.status = param, status


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str  # one of FINISH_REASONS
    logprobs: list[float] | None
    prompt_tokens: int
    completion_tokens: int
    top_logprobs: list[list[tuple[int, float]]] | None = None
    error: str | None = None


@dataclass
class Event:
    """What a request emits after each of its tokens: a text delta, and ``done`` on the last one."""

    delta: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    done: Completion | None = None


@dataclass
class Request:
    """One submission as the scheduler tracks it (owned by the engine thread)."""

    id: int
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[Event], None]
    sampler: SamplerState | None = None
    stop_ids: frozenset[int] = frozenset()
    plain_greedy: bool = False  # argmax of raw logits suffices (batched fast path)
    cache: Cache | None = None  # own single-row cache while prefilling
    n_fed: int = 0
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    detok: IncrementalDetokenizer | None = None
    text: str = ""
    sent: int = 0  # characters of ``text`` already emitted
    finish: str | None = None
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.monotonic)
