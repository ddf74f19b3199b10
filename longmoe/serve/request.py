"""A request inside the engine and what it gives back: its state, per-token events, the result.

``Request`` is the engine's record of one submission (prompt, sampling state, its cache while
prefilling, output so far, text and how much of it was sent); ``Event`` is what the request's sink
receives after each token and ``Completion`` the final result.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
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
    block_hashes: list[bytes] = field(default_factory=list)  # prefix reuse: chained hash per block
    reused: int = 0  # prompt tokens restored from a prefix snapshot
    prefix_stops: set[int] = field(default_factory=set)  # prompt lengths others wait to reuse
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    detok: IncrementalDetokenizer | None = None
    text: str = ""
    sent: int = 0  # characters of ``text`` already emitted
    finish: str | None = None
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.monotonic)


class RequestHandle:
    """A submitted request: iterate its events, wait for the result, or cancel it."""

    def __init__(self, req: Request, q: queue.Queue | None, cancel: Callable[[Request], None]) -> None:
        self._req, self._q, self._cancel = req, q, cancel
        self.id, self.prompt_tokens = req.id, len(req.prompt_ids)
        self.completion: Completion | None = None

    def cancel(self) -> None:
        self._cancel(self._req)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        if self._q is None:
            raise RuntimeError("this request delivers its events to the sink it was submitted with")
        while self.completion is None:
            ev = self._q.get(timeout=timeout)
            if ev.done is not None:
                self.completion = ev.done
            yield ev

    def result(self, timeout: float | None = None) -> Completion:
        for _ in self.events(timeout):
            pass
        assert self.completion is not None
        if self.completion.finish_reason == "error":
            raise RuntimeError(f"request {self.id} failed: {self.completion.error}")
        return self.completion
