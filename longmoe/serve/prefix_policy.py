"""Prefix reuse, the admission policy: which snapshot a request starts from, and who computes a
shared prefix.

The snapshots themselves are the store's (``serve/prefix_store.py``). Concurrent requests sharing a
prefix (``G`` samples of one task, one system prompt) are scheduled so that only the oldest computes
it: ``ready`` holds back a request that has not started while an older one is still prefilling their
common blocks, and asks the older one to stop a chunk at that boundary (``stops``). Chunks end on the
block grid (``chunk``, ``fit``) so the prefill leaves a state at every boundary the store wants.
"""

from __future__ import annotations

from collections.abc import Sequence

from longmoe.serve.prefix_store import SnapshotStore
from longmoe.serve.request import Request


class PrefixPolicy:
    """Reuse and prefill grouping over a ``SnapshotStore`` (see the module docstring)."""

    def __init__(self, store: SnapshotStore, record_states: bool) -> None:
        """``record_states``: the prefill records states inside its calls (``Cache.record_chunk_states``;
        not under --compile), so a chunk needs to end only at boundaries others wait for."""
        self.store, self.block_size, self.record_states = store, store.block_size, record_states
        self.stops: dict[int, set[int]] = {}  # request id -> prompt lengths others wait to reuse

    def admit(self, r: Request) -> None:
        """A newly admitted request (not continuing a session): its block keys, and the longest stored
        prefix of its prompt. A scored prompt (every position's logits) reuses nothing."""
        if r.scoring:
            return
        r.block_hashes = self.store.hashes(r.prompt_ids, r.image_marks)
        self.reuse(r)

    def done(self, r: Request) -> None:
        """``r`` finished prefilling (or left): count it and forget its stops."""
        self.stops.pop(r.id, None)
        if r.block_hashes and r.n_fed >= len(r.prompt_ids):
            self.store.count(r.reused)

    def reuse(self, r: Request) -> None:
        """Start ``r`` from the longest stored prefix of its prompt, if longer than what it has."""
        if r.scoring:
            return
        n, cache = self.store.lookup(r.prompt_ids, r.block_hashes, longer_than=r.n_fed, marks=r.image_marks)
        if cache is not None:
            r.cache, r.n_fed, r.reused = cache, n, n

    def ready(self, prefilling: Sequence[Request]) -> list[Request]:
        """The prefilling requests to feed now (oldest first); see the module docstring."""
        out = []
        for i, r in enumerate(prefilling):
            if r.n_fed == r.reused:  # not started: a snapshot may have appeared since admission
                self.reuse(r)
                wait = False
                for o in prefilling[:i]:
                    s = self.shared(o, r)
                    if s > r.n_fed and o.n_fed < s:
                        self.stops.setdefault(o.id, set()).add(s)
                        wait = True
                if wait:
                    continue
            out.append(r)
        return out

    def shared(self, a: Request, b: Request) -> int:
        """Tokens of ``b``'s reusable prefix that ``a``'s prompt shares, in whole blocks."""
        n = 0
        for x, y in zip(a.block_hashes, b.block_hashes, strict=False):
            if x != y:
                break
            n += 1
        return min(
            n * self.block_size,
            self.store.last_boundary(len(b.prompt_ids)),
            self.store.last_boundary(len(a.prompt_ids)),
        )

    def chunk(self, r: Request, n: int) -> int:
        """How many of ``n`` planned prompt tokens ``r`` should take so its chunk ends where a snapshot
        is wanted: at a stop another request waits for, at a block edge, and (when prefill records no
        states inside its calls) at its last block boundary."""
        start, end = r.n_fed, r.n_fed + n
        last = () if self.record_states else (self.store.last_boundary(len(r.prompt_ids)),)
        wanted = [*self.stops.get(r.id, ()), *last]
        stops = [s for s in wanted if start < s < end]
        if stops:
            return min(stops) - start
        if end < len(r.prompt_ids) and end // self.block_size * self.block_size > start:
            return end // self.block_size * self.block_size - start
        return n

    def fit(self, group: list[Request], n: int) -> tuple[list[Request], int]:
        """Keep the rows that go on after this chunk on the block grid (their chunked scans then pass
        block boundaries, where ``Cache.record_chunk_states`` records states): a chunk of ``n`` tokens that is
        not a block multiple is shortened to one, or (shorter than a block) fed only to the rows it
        completes."""
        bs = self.block_size
        cont = [r for r in group if r.block_hashes and len(r.prompt_ids) - r.n_fed > n]
        if n % bs == 0 or not cont:
            return group, n
        if n >= bs:
            return group, n - n % bs
        done = [r for r in group if r not in cont]
        return (done, n) if done else (group, n)
