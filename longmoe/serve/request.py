"""A request inside the engine and what it gives back: its state, per-token events, the result.

``Request`` is the engine's record of one submission (prompt, sampling state, its cache while
prefilling, the tokens so far); its text lives in the output processor (``serve/output.py``).
``Event`` is what the request's sink receives after each token and ``Completion`` the final result.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from longmoe.cache import Cache
from longmoe.serve.budget import CacheBudget, CacheBudgetError
from longmoe.serve.errors import EngineError
from longmoe.serve.sampling import SamplerState, SamplingParams, TokenChoice
from longmoe.serve.session import Session

if TYPE_CHECKING:
    import torch

FINISH_REASONS = ("stop", "length", "cancelled", "error")

Mark = tuple[int, bytes]  # (prompt position of an image's first patch, the image's pixel digest)


class RequestImages(Protocol):
    """What the bookkeeping needs of a prompt's images (``serve/prompt_images.PromptImages``; not
    imported, so the scheduler's imports stay free of the model)."""

    patches: list[Any]  # the images' Patches, in prompt order
    marks: tuple[Mark, ...]

    def release(self) -> None: ...


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
    cached_tokens: int = 0  # prompt tokens not prefilled: a session's kept row or a prefix snapshot
    queue_s: float = 0.0  # seconds from submission to admission (the whole life if never admitted)
    # with ``SamplingParams.prompt_logprobs``: [T] None, then log p(x_t | x_<t); and the k alternatives
    prompt_logprobs: list[float | None] | None = None
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None


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
    reused: int = 0  # prompt tokens restored from a prefix snapshot or a session's kept row
    session: Session | None = None  # keeps its cache row when the request finishes
    keep_end: bool = False  # its finished row becomes a prefix snapshot (``SnapshotStore.store_end``)
    images: RequestImages | None = None  # the prompt's images (serve/prompt_images.py)
    salt: bytes | None = None  # prefix reuse only among requests of the same salt (``Engine.submit``)
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    prompt_lps: list[float | None] = field(default_factory=lambda: [None])  # scoring: see Completion
    prompt_tops: list[list[tuple[int, float]] | None] = field(default_factory=lambda: [None])
    max_context: int = 1 << 62  # prompt + output limit (the engine's context window)
    finish: str | None = None
    cancelled: bool = False
    submitted_at: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None  # when the scheduler admitted it (queue time for metrics)

    @classmethod
    def new(
        cls,
        rid: int,
        ids: list[int],
        params: SamplingParams,
        sink: Callable[[Event], None],
        end_ids: tuple[int, ...],
        vocab_size: int,
        device: torch.device,
        session: Session | None = None,
        images: RequestImages | None = None,
        max_context: int = 1 << 62,
    ) -> Request:
        """A submission with its stop ids (``end_ids``, the tokenizer's end tokens, unless
        ``ignore_eos``) and its own sampler (seeded generator, penalties, constraint)."""
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(end_ids)
        return cls(
            rid,
            ids,
            params,
            sink,
            sampler=SamplerState(params, ids, vocab_size, device),
            stop_ids=frozenset(stop_ids),
            plain_greedy=plain_greedy(params),
            session=session,
            images=images,
            max_context=max_context,
        )

    @property
    def lives_on(self) -> bool:
        """Whether the request's row lives on once it finishes by a stop or the length limit (a
        session's next turn, or an end-of-request prefix snapshot)."""
        return self.session is not None or self.keep_end

    @property
    def keeps_row(self) -> bool:
        """Whether the finished request's cache row lives on (a session's next turn continues it, the
        scheduler's ``_keep_session``, or an end-of-request prefix snapshot, ``_keep_end``): it must then
        have seen exactly ``prompt_ids + out[:-1]``."""
        return self.lives_on and self.finish in ("stop", "length")

    @property
    def image_marks(self) -> tuple[Mark, ...]:
        """What prefix keys add for the prompt's images: ``(first patch position, pixel digest)``; a
        salt is one more mark at position 0, so it joins the first block's hash and every later one."""
        marks = self.images.marks if self.images is not None else ()
        return marks if self.salt is None else ((0, self.salt), *marks)

    @property
    def scoring(self) -> bool:
        """Whether the prompt is scored (``SamplingParams.prompt_logprobs``): prefilled alone, with
        every position's logits, never from a snapshot."""
        return self.params.prompt_logprobs is not None

    def stop_reason(self, token: int, n_out: int) -> str | None:
        """The finish the runner can decide alone after ``token``, the ``n_out``-th output token (its
        sampler has accepted it): a stop token, the constraint closed, the length limit (see
        ``step.RUNNER_FINISHES``); None: go on. Stop strings need the text (``serve/output.py``)."""
        if token in self.stop_ids:
            return "stop_token"
        if self.sampler is not None and self.sampler.constrained_done:  # e.g. the JSON is closed
            return "complete"
        if n_out >= self.params.max_tokens or len(self.prompt_ids) + n_out >= self.max_context:
            return "length"
        return None

    def append(self, choice: TokenChoice) -> None:
        """Record a chosen token (and its logprobs)."""
        self.out.append(choice.token)
        if choice.logprob is not None:
            self.lps.append(choice.logprob)
        if choice.top is not None:
            self.tops.append(choice.top)

    def complete(self, reason: str, text: str, error: str | None = None) -> Completion:
        """Mark the request finished and build its result (``text``: from the output processor)."""
        self.finish = reason
        want_lp = self.params.logprobs or self.params.top_logprobs
        scored = self.scoring and len(self.prompt_lps) == len(self.prompt_ids)
        return Completion(
            text=text,
            token_ids=list(self.out),
            finish_reason=reason,
            logprobs=list(self.lps) if want_lp else None,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.out),
            top_logprobs=list(self.tops) if self.params.top_logprobs else None,
            error=error,
            cached_tokens=self.reused,
            queue_s=(self.admitted_at or time.monotonic()) - self.submitted_at,
            prompt_logprobs=list(self.prompt_lps) if scored else None,
            prompt_top_logprobs=list(self.prompt_tops) if scored and self.params.prompt_logprobs else None,
        )


def check_ids(prompt: object, vocab_size: int) -> list[int]:
    """``prompt`` as a list of token ids in ``[0, vocab_size)``, or ``EngineError``."""
    if not isinstance(prompt, list | tuple) or any(
        isinstance(t, bool) or not isinstance(t, int) for t in prompt
    ):
        raise EngineError("prompt", "expected a string or a list of token ids")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise EngineError("prompt", f"token ids must be in [0, {vocab_size}), got {bad[:5]}")
    return list(prompt)


def plain_greedy(p: SamplingParams) -> bool:
    """Whether the argmax of the raw logits picks the token (the batched greedy fast path)."""
    return (
        p.greedy
        and p.repetition_penalty == 1.0
        and not (p.frequency_penalty or p.presence_penalty)
        and not (p.logprobs or p.top_logprobs)
        and p.constraint is None
    )


def check_lengths(n_prompt: int, max_tokens: int, max_context: int, budget: CacheBudget) -> None:
    """Raise ``EngineError`` unless a prompt of ``n_prompt`` tokens + ``max_tokens`` fits the context
    window and the whole cache budget."""
    if not n_prompt:
        raise EngineError("prompt", "is empty: expected at least one token")
    if n_prompt >= max_context:
        raise EngineError(
            "prompt",
            f"has {n_prompt} tokens but the context window is {max_context} "
            "(the prompt must leave room for at least one generated token)",
        )
    if n_prompt + max_tokens > max_context:
        raise EngineError(
            "max_tokens",
            f"{max_tokens} + {n_prompt} prompt tokens exceeds the context window of "
            f"{max_context}; expected max_tokens <= {max_context - n_prompt}",
        )
    try:
        budget.check(n_prompt + max_tokens)
    except CacheBudgetError as e:
        raise EngineError("max_tokens", str(e)) from e


class RequestHandle:
    """A submitted request: iterate its events, wait for the result, or cancel it."""

    def __init__(
        self,
        req: Request,
        q: queue.Queue | None,
        cancel: Callable[[Request], None],
        pump: Callable[[], bool] | None = None,
    ) -> None:
        # pump: runs one engine step in this thread when no engine thread does (False: wait instead)
        self._req, self._q, self._cancel, self._pump = req, q, cancel, pump
        self.id, self.prompt_tokens = req.id, len(req.prompt_ids)
        self.completion: Completion | None = None

    def cancel(self) -> None:
        self._cancel(self._req)
        if self._pump is not None:
            self._pump()  # without an engine thread, the row leaves the batch now

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        if self._q is None:
            raise RuntimeError("this request delivers its events to the sink it was submitted with")
        while self.completion is None:
            try:
                ev = self._q.get_nowait()
            except queue.Empty:
                if self._pump is not None and self._pump():
                    continue
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
