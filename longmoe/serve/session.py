"""Sessions: a multi-turn conversation (an agent's episode) that keeps its cache row between requests.

An episode alternates between the model (an assistant turn) and the caller (a tool observation). A
``Session`` keeps the finished request's cache row inside the engine, so the next request of the
session supplies only the **new** tokens (the observation and the next ``<|assistant|>`` header):
the engine prefills just those, in chunks, on top of the kept row. With a constant-size KDA state and
a latent MLA cache the row is small, and a turn costs O(new tokens) instead of O(trajectory).

Why keep the row rather than snapshot it into the prefix cache at the end of generation and let the
resubmitted trajectory hit it: the prefix cache also keeps each finished request's end
(``SnapshotStore.store_end``), but a resubmitted trajectory would hash and token-verify the whole
trajectory and rebuild the row from all its segments (an O(trajectory) copy), and a snapshot may be
evicted. A kept
row is exact (no block rounding), costs one row copy when it leaves and rejoins the batch, and is
only dropped under memory pressure, in which case the next turn transparently re-prefills the
session's tokens (same outputs, only slower). ``bench/rollout.py`` measures all three.

Tokens: ``Session.tokens`` is the whole context so far (every prompt piece and every generated
token). The kept row has seen ``tokens[:cached]``; the last generated token is not yet in it (decode
feeds a token one step after choosing it), so a continuation request's prompt is ``tokens + new`` and
its prefill starts at ``cached``. Greedy outputs equal those of a fresh request with the full prompt.

Memory: an idle session's row is reserved in the engine's ``CacheBudget`` under the session's key
(its real length, not the finished request's ``max_tokens``); a continuation's admission swaps that
reservation for one covering the whole new request. When a request cannot be admitted, prefix
snapshots are evicted first, then the least recently used idle sessions' rows. ``Engine.close_session``
releases everything.

Threading: callers touch a session only through ``Engine.submit`` / ``close_session``; the engine
thread owns its row. ``active`` is set on submit and cleared before the result is delivered, so a
caller that waits for its result can submit the next turn at once (one request per session at a time).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field

from longmoe.cache import Cache
from longmoe.serve.budget import CacheBudget

_IDS = itertools.count()


class SessionError(ValueError):
    """A request on a closed session, or a second one while the first is in flight."""


@dataclass(eq=False)
class Session:
    """One conversation's engine-side state (see the module docstring)."""

    id: int = field(default_factory=lambda: next(_IDS))
    tokens: list[int] = field(default_factory=list)  # the whole context so far
    images: list = field(default_factory=list)  # Patches of the images in ``tokens``, in order
    cache: Cache | None = None  # kept row (engine thread only), has seen tokens[:cached]
    cached: int = 0
    active: bool = False  # a request of this session is queued or running
    closed: bool = False
    turns: int = 0  # requests finished

    def check(self) -> None:
        """Raise unless a request may be submitted on this session now."""
        if self.closed:
            raise SessionError(f"session {self.id} is closed")
        if self.active:
            raise SessionError(f"session {self.id} already has a request in flight")

    @property
    def key(self) -> str:
        """The session's reservation key in the ``CacheBudget``."""
        return f"session:{self.id}"


@dataclass
class SessionStats:
    turns: int = 0  # session requests that finished prefill
    tokens_reused: int = 0  # context tokens not prefilled thanks to a kept row
    evictions: int = 0  # kept rows dropped for memory (the next turn re-prefills)


class Sessions:
    """The engine's idle kept rows, least recently used first, and their reservations."""

    def __init__(self, budget: CacheBudget) -> None:
        self.budget = budget
        self.idle: OrderedDict[int, Session] = OrderedDict()
        self.stats = SessionStats()

    def keep(self, s: Session, cache: Cache | None) -> None:
        """Store the finished request's one-row ``cache`` (None: dropped) and reserve its bytes."""
        self.drop(s)
        if cache is None or s.closed:
            return
        s.cache, s.cached = cache, int(cache.seq_lens[0])
        self.budget.reserved[s.key] = self.budget.spec.bytes_for(s.cached, self.budget.block_size)
        self.idle[s.id] = s

    def take(self, s: Session) -> tuple[Cache | None, int]:
        """The kept row for a continuation being admitted (its reservation is swapped by the caller)."""
        self.idle.pop(s.id, None)
        cache, n = s.cache, s.cached
        s.cache, s.cached = None, 0
        return cache, n if cache is not None else 0

    def drop(self, s: Session) -> None:
        """Forget ``s``'s kept row and release its reservation."""
        self.idle.pop(s.id, None)
        s.cache, s.cached = None, 0
        self.budget.release(s.key)

    def evict_one(self, keep: Session | None = None) -> bool:
        """Drop the least recently used idle row other than ``keep``'s; False if there is none."""
        for s in self.idle.values():
            if s is not keep:
                self.drop(s)
                self.stats.evictions += 1
                return True
        return False

    def report(self) -> dict[str, int]:
        st = self.stats
        return {
            "session_turns": st.turns,
            "session_tokens_reused": st.tokens_reused,
            "session_evictions": st.evictions,
            "sessions_idle": len(self.idle),
        }
