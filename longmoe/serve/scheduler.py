"""The scheduler: request queues, admission against the cache budget, and each step's batch.

As vLLM's scheduler, bookkeeping only (no tensors, no forward pass: ``serve/runner.py`` does those),
so it is tested without a model. Caches pass through it as opaque objects (a fresh one from
``new_cache``, a session's kept row from ``Sessions``, a prefix snapshot from the ``SnapshotStore``).

A step goes one way (``serve/step.py``): ``schedule()`` plans it, the runner executes the plan,
``update(plan, output)`` records each token through the output processor (``serve/output.py``: text,
stop strings), emits events, finishes requests and moves them between queues.

A request moves ``incoming`` (submitted, any thread) → ``waiting`` → ``prefilling`` (admitted: a
budget reservation for its whole life, prompt + ``max_tokens``, and its own one-row cache) →
``running`` (first token chosen: a row of the runner's batch cache) → finished. A row the runner did
not finish itself (a stop string, a cancellation, a consumer that raised) leaves the batch at the
start of the next step (``leaving``).
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
from typing import TYPE_CHECKING, Any

from longmoe.serve.errors import EngineError
from longmoe.serve.output import OutputProcessor
from longmoe.serve.request import FINISH_REASONS, Event, Request
from longmoe.serve.session import Session, Sessions
from longmoe.serve.step import RowOutput, StepOutput, StepPlan

if TYPE_CHECKING:
    from longmoe.serve.budget import CacheBudget
    from longmoe.serve.prefix_policy import PrefixPolicy

log = logging.getLogger(__name__)

TPS_WINDOW_S = 10.0  # tokens_per_second averages over this window
MIN_PREFILL_ROW = 16  # fewest prompt tokens per row when prefill chunks are shared by several requests


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
        prefix: PrefixPolicy | None = None,
        outputs: OutputProcessor | None = None,
    ) -> None:
        """``prefix``: prefix reuse (its policy, over the snapshot store); ``outputs``: the requests'
        text (None: no text, the model-free tests)."""
        self.budget, self.new_cache, self.prefix = budget, new_cache, prefix
        self.outputs = outputs or OutputProcessor(None)
        self.max_batch, self.max_waiting, self.prefill_chunk = max_batch, max_waiting, prefill_chunk
        self.max_context = max_context
        self.sessions = Sessions(budget)
        self.cv = threading.Condition()
        self.closed = False
        self.incoming: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []  # the requests whose rows are in the runner's batch cache
        self.leaving: dict[int, bool] = {}  # finished running rows to leave next step (id -> handed back)
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
        return bool(self.incoming or self.waiting or self.n_running or self._closing or self.leaving)

    @property
    def n_waiting(self) -> int:
        return len(self.waiting) + len(self.incoming)

    @property
    def n_running(self) -> int:
        return len(self.prefilling) + len(self.running)

    # ------------------------------------------------------------------ engine thread: one step
    def intake(self) -> bool:
        """Take new submissions, drop closed sessions' rows, finish cancelled requests. True when a
        running row was cancelled (it leaves the batch at the start of the step, ``leaving``)."""
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
        for r in [r for r in self.prefilling if r.cancelled]:
            self.prefilling.remove(r)
            r.cache = None
            self.finish(r, "cancelled")
            if self.prefix is not None:
                self.prefix.done(r)
        for r in self.running:
            if r.cancelled and r.finish is None:
                self.finish(r, "cancelled")
                self.leaving[r.id] = False
        return True

    def schedule(self) -> StepPlan:
        """Take submissions and cancellations (``intake``), admit what fits, then plan the step: rows
        leave, decode every running row, prefill one chunk.

        The chunk goes to the oldest prefilling requests that are ready (``PrefixPolicy.ready`` holds
        back one whose prefix an older request is computing): ``k`` rows that each get the same number
        ``L = min(shortest remaining prompt, prefill_chunk // k)`` of tokens, a dense ``[k, L]`` batch.
        Any split of a prompt gives the same logits, so the grouping never changes an output. With
        prefix reuse the chunk ends where a snapshot is wanted (``PrefixPolicy.chunk``). A scored
        prompt (every position's logits) is a chunk of its own."""
        self.intake()
        self._admit()
        leaving, self.leaving = self.leaving, {}
        plan = StepPlan(decode=[r for r in self.running if r.id not in leaving], leaving=leaving)
        ready = self.prefilling if self.prefix is None else self.prefix.ready(self.prefilling)
        if any(leaving.values()):  # rows coming back (snapshots, sessions): nothing starts before them
            ready = [r for r in ready if r.n_fed > r.reused]
        if ready:
            cs = self.prefill_chunk
            if ready[0].scoring:
                group = ready[:1]
            else:
                group = [r for r in ready if not r.scoring][: max(1, cs // MIN_PREFILL_ROW)]
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
            if s is not None and any(o.session is s for o in self.running if o.id in self.leaving):
                return  # its previous turn's row comes back at the next step: continue it then
            key = s.key if s is not None else None
            while not self.budget.try_reserve(r.id, len(r.prompt_ids) + r.params.max_tokens, key):
                if self.prefix is not None and self.prefix.store.evict_one():  # snapshots go first,
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
            r.keep_end = s is None and self.prefix is not None and not r.scoring
            if self.prefix is not None and r.reused == 0:
                self.prefix.admit(r)
            self.prefilling.append(r)

    def update(self, plan: StepPlan, out: StepOutput) -> None:
        """Record what the runner did for ``plan``: emit each token (finishing requests), hand the rows
        that came back to sessions and prefix snapshots, move completed prompts to ``running``."""
        by_id = {r.id: r for r in self.running}
        for rid in plan.leaving:  # finished earlier; their rows left the batch at the step's start
            r = by_id[rid]
            self.running.remove(r)
            self._release_row(r, out.rows.get(rid))
        n_tokens = 0
        for rid, row in out.decoded.items():
            r = by_id[rid]
            n_tokens += self._record(r, row)
            if row.finish is not None:  # the runner finished it: its row left the batch
                self.running.remove(r)
                self._release_row(r, out.rows.get(rid))
            elif r.finish is not None:  # finished here (a stop string, a consumer): leaves next step
                self.leaving[rid] = r.keeps_row
        for r in plan.prefill:
            n_tokens += self._fed(r, out)
        self.count_step(n_tokens)

    def _fed(self, r: Request, out: StepOutput) -> int:
        """``r``'s cache consumed its chunk; a completed prompt's first token. Returns tokens emitted."""
        r.n_fed += out.fed[r.id]
        if r.scoring:
            r.prompt_lps += out.prompt_logprobs.get(r.id, [])
            r.prompt_tops += out.prompt_top.get(r.id, [])
        if self.prefix is not None and r.cache is not None and r.block_hashes:
            states = out.chunk_states.get(r.id)
            self.prefix.store.store(r.prompt_ids, r.block_hashes, r.cache, r.image_marks, states)
        if r.n_fed < len(r.prompt_ids):
            return 0
        if r.images is not None:
            r.images.release()
        if self.prefix is not None:
            self.prefix.done(r)
        self.prefilling.remove(r)
        row = out.first[r.id]
        n = self._record(r, row)
        if r.id in out.joined:  # a row of the batch now (the runner stacked its cache)
            r.cache = None
            self.running.append(r)
            if r.finish is not None:
                self.leaving[r.id] = r.keeps_row
        else:
            self._release_row(r, r.cache)
            r.cache = None
        return n

    def _record(self, r: Request, row: RowOutput) -> int:
        """Record ``row``'s tokens in order until the request finishes; returns how many were recorded.
        The text, its stop strings and the final reason come from the output processor."""
        if not row.choices:  # a scored prompt without generation
            self.finish(r, row.finish or "length")
            return 0
        for i, choice in enumerate(row.choices):
            r.append(choice)
            last = i == len(row.choices) - 1
            reason, delta = self.outputs.process(
                r.id, choice.token, r.params.stop, row.finish if last else None
            )
            lp = [choice.logprob] if choice.logprob is not None else None
            if reason is not None:
                self.finish(r, reason, delta, [choice.token], lp)
                return i + 1
            try:
                r.sink(Event(delta, [choice.token], lp))
            except Exception:  # a consumer that raises loses its own request, never the batch
                log.exception("request %d: its consumer raised; finishing it", r.id)
                self.finish(r, "error", error="the request's event consumer raised")
                return i + 1
        return len(row.choices)

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
        """Bytes of the caches the scheduler holds (prefilling rows, idle sessions' rows)."""
        live = sum(r.cache.nbytes() for r in self.prefilling if r.cache is not None)
        return live + sum(s.cache.nbytes() for s in self.sessions.idle.values() if s.cache is not None)

    # ------------------------------------------------------------------ finishing
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
        done = r.complete(reason, self.outputs.finish(r.id, reason), error)
        try:
            r.sink(Event(delta, new or [], lp, done))
        except Exception:  # a consumer that went away must not break the scheduler
            log.exception("request %d: delivering the result failed", r.id)

    def fail_all(self, error: str, reason: str = "error") -> None:
        """Finish every request (a failed step, or closing); the runner's batch must be dropped too."""
        with self.cv:
            self.waiting.extend(self.incoming)
            self.incoming.clear()
        for r in list(self.waiting) + self.prefilling + self.running:
            if r.finish is None:
                self.finish(r, reason, error=error)
        self.waiting.clear()
        self.prefilling, self.running, self.leaving = [], [], {}
        if self.prefix is not None:
            self.prefix.stops.clear()

    def _release_row(self, r: Request, cache: Any) -> None:
        """A finished request's row is out of the batch (``cache``: it, if handed back). If it lives on
        (``Request.keeps_row``) and has seen exactly ``prompt_ids + out[:-1]`` (a speculative row
        finished by a stop string has seen more), it becomes an end-of-request prefix snapshot
        (multi-turn chat: the next turn starts where this one ended) or the session's kept row."""
        if cache is not None and (
            not r.keeps_row or int(cache.seq_lens[0]) != len(r.prompt_ids) + len(r.out) - 1
        ):
            cache = None
        if cache is not None and r.keep_end:
            self.prefix.store.store_end(r, cache)  # type: ignore[union-attr]
        if r.session is not None:
            self.sessions.keep(r.session, cache)
