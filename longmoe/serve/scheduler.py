"""The scheduler: request queues, admission against the cache budget, and each step's batch.

As vLLM's scheduler, bookkeeping only (no tensors, no forward pass: ``serve/runner.py`` does those),
so it is tested without a model. Caches pass through it as opaque objects (a fresh one from
``new_cache``, a session's kept row from ``Sessions``, a prefix snapshot from ``PrefixCache``).

A request moves ``incoming`` (submitted, any thread) → ``waiting`` → ``prefilling`` (admitted: a
budget reservation for its whole life, prompt + ``max_tokens``, and its own one-row cache) →
``joining`` (first token chosen) → ``running`` (a row of the runner's batch cache) → finished.
Admission is first come, first served: nothing overtakes the oldest waiting request; when the budget
is short, prefix snapshots are evicted first, then idle sessions' kept rows, else it waits.
``Request.reused`` counts the prompt tokens a request did not prefill (reported as ``cached_tokens``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from longmoe.serve.errors import EngineError
from longmoe.serve.request import FINISH_REASONS, Event, Request
from longmoe.serve.session import Session, Sessions

if TYPE_CHECKING:
    from longmoe.serve.budget import CacheBudget
    from longmoe.serve.prefix_cache import PrefixCache
    from longmoe.serve.sampling import TokenChoice

log = logging.getLogger(__name__)

TPS_WINDOW_S = 10.0  # tokens_per_second averages over this window
MIN_PREFILL_ROW = 16  # fewest prompt tokens per row when prefill chunks are shared by several requests


@dataclass
class StepPlan:
    """What one step runs: a decode step over ``decode`` (the running batch, in row order), then one
    prefill chunk of ``chunk`` prompt tokens for each request of ``prefill``."""

    decode: list[Request] = field(default_factory=list)
    prefill: list[Request] = field(default_factory=list)
    chunk: int = 0


@dataclass
class Regroup:
    """A change of the batch membership: rows ``keep`` stay, in order (None: every row does), rows
    ``rows_kept`` are handed back as one-row caches for their sessions, then ``joining`` are appended."""

    keep: list[int] | None
    rows_kept: list[int]
    joining: list[Any]


class Scheduler:
    """Queues, admission and batch membership (see the module docstring).

    ``add``, ``cancel``, ``close_session`` and ``close`` are thread-safe (under ``cv``); everything
    else runs on the engine thread."""

    def __init__(
        self,
        budget: CacheBudget,
        new_cache: Callable[[], Any],
        *,
        max_batch: int,
        max_waiting: int,
        prefill_chunk: int,
        max_context: int,
        prefix: PrefixCache | None = None,
    ) -> None:
        self.budget, self.new_cache, self.prefix = budget, new_cache, prefix
        self.max_batch, self.max_waiting, self.prefill_chunk = max_batch, max_waiting, prefill_chunk
        self.max_context = max_context
        self.sessions = Sessions(budget)
        self.cv = threading.Condition()
        self.closed = False
        self.incoming: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.joining: list[Request] = []
        self.running: list[Request] = []  # the rows of the runner's batch cache, in order
        self._closing: list[Session] = []
        self._cancel_pending = False
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps
        self.counters = {"requests": 0, "prompt_tokens": 0, "generated_tokens": 0, "steps": 0}
        self.finished = dict.fromkeys(FINISH_REASONS, 0)

    # ------------------------------------------------------------------ any thread
    def add(self, req: Request) -> None:
        """Queue a submission (``RuntimeError`` once closed, ``EngineError`` when the queue is full)."""
        with self.cv:
            if self.closed:
                raise RuntimeError("engine is closed")
            if self.n_waiting >= self.max_waiting:
                raise EngineError("queue", f"is full ({self.max_waiting} waiting requests)", 503)
            if req.session is not None:
                req.session.check()
                req.session.active = True
            self.incoming.append(req)
            self.counters["requests"] += 1
            self.counters["prompt_tokens"] += len(req.prompt_ids)
            self.cv.notify_all()

    def cancel(self, req: Request) -> None:
        with self.cv:
            req.cancelled = True
            self._cancel_pending = True
            self.cv.notify_all()

    def close_session(self, s: Session) -> None:
        """Release the session's kept row (after its running request, if any, finishes)."""
        with self.cv:
            s.closed = True
            self._closing.append(s)
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def wait_for_work(self) -> bool:
        """Block until there is work (True) or the scheduler is closed (False)."""
        with self.cv:
            while not self.closed and not self.has_work():
                self.cv.wait()
            return not self.closed

    def has_work(self) -> bool:
        return bool(self.incoming or self.waiting or self.n_running or self._closing)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting) + len(self.incoming)

    @property
    def n_running(self) -> int:
        return len(self.prefilling) + len(self.joining) + len(self.running)

    # ------------------------------------------------------------------ engine thread: one step
    def intake(self) -> bool:
        """Take new submissions, drop closed sessions' rows, finish cancelled requests. True when a
        running row was cancelled (the batch must be regrouped before the next step)."""
        with self.cv:
            self.waiting.extend(self.incoming)
            self.incoming.clear()
            reap, self._cancel_pending = self._cancel_pending, False
            closing, self._closing = self._closing, []
        for s in closing:
            if not s.active:  # an active one is dropped when its request finishes
                self.sessions.drop(s)
        if not reap:
            return False
        for r in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(r)
            self.finish(r, "cancelled")
        for lst in (self.prefilling, self.joining):
            for r in [r for r in lst if r.cancelled]:
                lst.remove(r)
                r.cache = None
                self.finish(r, "cancelled")
        for r in self.running:
            if r.cancelled and r.finish is None:
                self.finish(r, "cancelled")
        return True

    def schedule(self) -> StepPlan:
        """Admit what fits, then plan the step: decode every running row, prefill one chunk.

        The chunk goes to the oldest prefilling requests that are ready (``PrefixCache.ready`` holds
        back one whose prefix an older request is computing): ``k`` rows that each get the same number
        ``L = min(shortest remaining prompt, prefill_chunk // k)`` of tokens, a dense ``[k, L]`` batch.
        Any split of a prompt gives the same logits, so the grouping never changes an output. With
        prefix reuse the chunk ends where a snapshot is wanted (``PrefixCache.chunk``)."""
        self._admit()
        plan = StepPlan(decode=list(self.running))
        if self.prefilling:
            cs = self.prefill_chunk
            ready = self.prefilling if self.prefix is None else self.prefix.ready(self.prefilling)
            group = ready[: max(1, cs // MIN_PREFILL_ROW)]
            L = min(min(len(r.prompt_ids) - r.n_fed for r in group), max(1, cs // len(group)))
            if self.prefix is not None and group[0].block_hashes:
                L = self.prefix.chunk(group[0], L)
            if self.prefix is not None:
                group, L = self.prefix.fit(group, L)
            plan.prefill, plan.chunk = group, L
        return plan

    def _admit(self) -> None:
        while self.waiting:
            if self.n_running >= self.max_batch:
                return
            r = self.waiting[0]
            s = r.session
            key = s.key if s is not None else None
            while not self.budget.try_reserve(r.id, len(r.prompt_ids) + r.params.max_tokens, key):
                if self.prefix is not None and self.prefix.evict_one():  # snapshots go first,
                    continue
                if not self.sessions.evict_one(keep=s):  # then idle sessions' kept rows
                    return  # wait for running requests to free their reservations (arrival order kept)
            self.waiting.popleft()
            r.admitted_at = time.monotonic()
            if s is not None and s.cache is not None:  # continue the session's kept row
                r.cache, r.n_fed = self.sessions.take(s)
                r.reused = r.n_fed
                self.sessions.stats.tokens_reused += r.n_fed
            else:
                r.cache = self.new_cache()
            if s is not None:
                self.sessions.stats.turns += 1
            r.keep_end = s is None and self.prefix is not None
            if self.prefix is not None and r.reused == 0:
                r.block_hashes = self.prefix.hashes(r.prompt_ids, r.image_marks)
                self.prefix.reuse(r)
            self.prefilling.append(r)

    def fed(self, r: Request, n: int) -> bool:
        """``r``'s cache has consumed ``n`` more prompt tokens; True when its prompt is complete (it
        leaves ``prefilling``; the caller chooses its first token, then calls ``prefilled``)."""
        r.n_fed += n
        if self.prefix is not None and r.cache is not None and r.block_hashes:
            self.prefix.store(r.prompt_ids, r.block_hashes, r.cache, r.image_marks, r.taps)
        r.taps = {}
        if r.n_fed < len(r.prompt_ids):
            return False
        if r.images is not None:
            r.images.release()
        if self.prefix is not None and r.block_hashes:
            self.prefix.count(r)
        self.prefilling.remove(r)
        return True

    def prefilled(self, r: Request) -> None:
        """After the first token: join the batch at the next regroup, or (finished already) leave."""
        if r.finish is None:
            self.joining.append(r)
        else:
            self._keep_end(r, r.cache)
            self._keep_session(r, r.cache)
            r.cache = None

    def reorder(self, order: list[int]) -> None:
        """The runner permuted the batch rows (speculative rollback): ``running`` follows."""
        self.running = [self.running[i] for i in order]

    def regroup(self) -> Regroup:
        """The membership change due now: finished rows leave, requests whose prefill ended join."""
        keep = [i for i, r in enumerate(self.running) if r.finish is None]
        kept = [i for i, r in enumerate(self.running) if r.keeps_row]
        stay = keep if len(keep) < len(self.running) else None
        return Regroup(stay, kept, [r.cache for r in self.joining])

    def regrouped(self, change: Regroup, rows: list[Any]) -> None:
        """Apply ``change`` once the runner did; ``rows``: the one-row caches of ``change.rows_kept``."""
        given = dict(zip(change.rows_kept, rows, strict=True))
        for i, r in enumerate(self.running):
            if r.finish is not None:
                self._keep_end(r, given.get(i))
            if r.finish is not None and r.session is not None:
                self._keep_session(r, given.get(i))
        if change.keep is not None:
            self.running = [self.running[i] for i in change.keep]
        self.running += self.joining
        for r in self.joining:
            r.cache = None
        self.joining = []

    def count_step(self, n_tokens: int) -> None:
        """A step ended having produced ``n_tokens`` tokens."""
        self.counters["steps"] += 1
        self.counters["generated_tokens"] += n_tokens
        now = time.monotonic()
        self._recent.append((now, n_tokens))
        while self._recent and now - self._recent[0][0] > TPS_WINDOW_S:
            self._recent.popleft()

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        return sum(n for t, n in list(self._recent) if now - t <= TPS_WINDOW_S) / TPS_WINDOW_S

    def held_bytes(self) -> int:
        """Bytes of the caches the scheduler holds (prefilling and joining rows, idle sessions' rows)."""
        live = sum(r.cache.nbytes() for r in self.prefilling + self.joining if r.cache is not None)
        return live + sum(s.cache.nbytes() for s in self.sessions.idle.values() if s.cache is not None)

    # ------------------------------------------------------------------ per-token bookkeeping
    def emit(self, r: Request, choice: TokenChoice) -> bool:
        """Record a token (``Request.record``: stop conditions, the safe text delta), finish if done;
        whether the request wants more tokens."""
        reason, delta = r.record(choice, self.max_context)
        lp = [choice.logprob] if choice.logprob is not None else None
        if reason is None:
            try:
                r.sink(Event(delta, [choice.token], lp))
            except Exception:  # a consumer that raises loses its own request, never the batch
                log.exception("request %d: its consumer raised; finishing it", r.id)
                self.finish(r, "error", error="the request's event consumer raised")
        else:
            self.finish(r, reason, delta, [choice.token], lp)
        return r.finish is None

    def finish(
        self,
        r: Request,
        reason: str,
        delta: str = "",
        new: list[int] | None = None,
        lp: list[float] | None = None,
        error: str | None = None,
    ) -> None:
        self.budget.release(r.id)
        if r.session is not None:  # before the result is delivered: the caller may continue at once
            if reason in ("stop", "length"):  # a cancelled or failed turn leaves the context unchanged
                r.session.tokens = r.prompt_ids + r.out
                r.session.images = list(r.images.patches) if r.images is not None else []
                r.session.turns += 1
            r.session.active = False
        self.finished[reason] += 1
        try:
            r.sink(Event(delta, new or [], lp, r.complete(reason, error)))
        except Exception:  # a consumer that went away must not break the scheduler
            log.exception("request %d: delivering the result failed", r.id)

    def fail_all(self, error: str, reason: str = "error") -> None:
        """Finish every request (a failed step, or closing); the runner's batch must be dropped too."""
        with self.cv:
            self.waiting.extend(self.incoming)
            self.incoming.clear()
        for r in list(self.waiting) + self.prefilling + self.joining + self.running:
            if r.finish is None:
                self.finish(r, reason, error=error)
        self.waiting.clear()
        self.prefilling, self.joining, self.running = [], [], []

    def _keep_end(self, r: Request, cache: Any) -> None:
        """A finished request's row (``Request.keep_end``) becomes a snapshot of the conversation so far
        (multi-turn chat: the next turn starts where this one ended)."""
        if cache is not None and r.keep_end and r.keeps_row:
            self.prefix.store_end(r, cache)  # type: ignore[union-attr]

    def _keep_session(self, r: Request, cache: Any) -> None:
        """A finished session request leaves its row (which has seen all but its last token) behind."""
        if r.session is not None:
            self.sessions.keep(r.session, cache if r.finish in ("stop", "length") else None)
