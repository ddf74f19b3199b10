"""Cache memory for serving: what a request costs (``CacheSpec``) and a byte budget in blocks.

Per request the model keeps a fixed-size part (e.g. every KDA layer's recurrent state + conv tail,
the same at 10 tokens or 1M) and a part that grows per token (e.g. ``d_c`` numbers per MLA layer);
each layer's state reports its own share (``LayerState.spec``). The
``CacheBudget`` reserves, at admission, the fixed part plus enough ``block_size``-token blocks of
per-token state for the request's whole life (prompt + ``max_tokens``), so a running request never runs out
and nothing needs preempting; a request that cannot fit even alone is rejected, one that cannot fit
now waits. Physically the latents live in the ``Cache`` tensors (grown by capacity buckets); the blocks are
the unit of accounting, and ``Cache.nbytes()`` reports what is actually live.

Prefix-reuse snapshots (``serve/prefix_store.py``) live in the same budget as ``snapshot_bytes``: they
only use what requests have not reserved, and are evicted before a request would wait.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from longmoe.cache import Cache

DEFAULT_BLOCK_SIZE = 16


class _HasCache(Protocol):  # a LongMoE; not imported, so the scheduler's imports stay model-free
    def new_cache(self, batch_size: int) -> Cache: ...


class CacheBudgetError(ValueError):
    """A request needs more cache than the whole budget allows."""


@dataclass(frozen=True)
class CacheSpec:
    """Bytes per request: ``fixed`` (e.g. KDA states + conv tails) and ``per_token`` (e.g. MLA latents)."""

    fixed: int
    per_token: int

    @staticmethod
    def of(model: _HasCache) -> CacheSpec:
        """Sum of what each layer's state reports for one row."""
        return CacheSpec.of_cache(model.new_cache(1))

    @staticmethod
    def of_cache(cache: Cache) -> CacheSpec:
        """What one row of ``cache`` costs (e.g. a target's and a draft model's layers together)."""
        s = cache.spec()
        return CacheSpec(s.fixed, s.per_token)

    def bytes_for(self, n_tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
        blocks = math.ceil(n_tokens / block_size)
        return self.fixed + blocks * block_size * self.per_token


class CacheBudget:
    """Reservations against ``budget_bytes``; not thread-safe (the engine's scheduler owns it)."""

    def __init__(self, spec: CacheSpec, budget_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if budget_bytes < spec.bytes_for(1, block_size):
            raise CacheBudgetError(
                f"cache_budget_bytes={budget_bytes} cannot hold even one token of one request "
                f"(needs {spec.bytes_for(1, block_size)})"
            )
        if block_size < 1:
            raise ValueError(f"block_size: expected an integer >= 1, got {block_size}")
        self.spec, self.budget, self.block_size = spec, int(budget_bytes), block_size
        self.reserved: dict[Hashable, int] = {}  # request id (or a session's key) -> bytes
        self.snapshot_bytes = 0  # prefix-reuse snapshots (evictable; owned by the SnapshotStore)

    @property
    def reserved_bytes(self) -> int:
        return sum(self.reserved.values())

    @property
    def free_bytes(self) -> int:
        """Bytes neither reserved by requests nor held by snapshots."""
        return self.budget - self.reserved_bytes - self.snapshot_bytes

    def max_tokens_alone(self) -> int:
        """Most tokens (prompt + output) one request may hold when it has the budget to itself."""
        blocks = (self.budget - self.spec.fixed) // max(1, self.block_size * self.spec.per_token)
        return int(blocks * self.block_size) if self.spec.per_token else 2**62

    def check(self, n_tokens: int) -> None:
        need = self.spec.bytes_for(n_tokens, self.block_size)
        if need > self.budget:
            raise CacheBudgetError(
                f"request needs {need:,} cache bytes for {n_tokens} tokens (prompt + max_tokens) but the "
                f"cache budget is {self.budget:,} bytes (at most {self.max_tokens_alone()} tokens)"
            )

    def try_reserve(self, rid: Hashable, n_tokens: int, replaces: Hashable | None = None) -> bool:
        """Reserve ``n_tokens`` for ``rid``; ``replaces``: a reservation given up in exchange (a
        session's kept row, which the request continues), which then counts as free."""
        self.check(n_tokens)
        need = self.spec.bytes_for(n_tokens, self.block_size)
        if need > self.free_bytes + self.reserved.get(replaces, 0):
            return False  # the caller may evict snapshots and retry
        self.reserved.pop(replaces, None)
        self.reserved[rid] = need
        return True

    def release(self, rid: Hashable) -> None:
        self.reserved.pop(rid, None)
