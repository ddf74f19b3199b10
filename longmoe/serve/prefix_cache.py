"""Prefix reuse: snapshots of prompt state at block boundaries, shared by requests with that prefix.

A recurrent (KDA) state cannot be cut at an arbitrary token, so the engine keeps **snapshots** at
block-aligned prompt lengths (multiples of ``block_size``): at the end of prefill chunks (which the
engine aligns to blocks) and at the last block boundary of each prompt. A snapshot at length ``e`` is
a chain node: the segments every layer gained from its parent's end to ``e`` (``LayerState.segment``:
the MLA latents of those tokens, the KDA state + conv tail at ``e``), so shared prefixes store their
latents once. A new request restores the longest stored prefix of its prompt (``Cache.from_segments``,
a copy: nothing a request does can change a snapshot) and prefills only the rest.

Keys are chained block hashes (as vLLM's): ``h_j = H(h_{j-1}, tokens of block j)``, so a node's key
names its whole prefix. A hit is also checked token by token against the node's chain, so two prompts
whose hashes collide can never get each other's state. Images: identical token ids can carry
different pixels, so ``marks`` (an image's first patch position and pixel digest,
``serve/prompt_images.py``) join the hash of the block holding that position and are checked on a
hit like the tokens.

Memory: snapshot bytes are accounted in the engine's ``CacheBudget`` (``snapshot_bytes``) and only
use what running requests have not reserved; least recently used leaves are evicted first, whenever a
snapshot or a request needs the room (a request never waits for snapshots).

Concurrent requests sharing a prefix (``G`` samples of one task, one system prompt) are scheduled so
that only the oldest computes it: ``ready`` holds back a request that has not started while an older
one is still prefilling their common blocks, and asks the older one to stop a chunk at that boundary.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from longmoe.cache import Cache, LayerState
from longmoe.serve.budget import CacheBudget
from longmoe.serve.request import Request

HashFn = Callable[[bytes, Sequence[int]], bytes]


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    """Chained hash of one block: ``parent`` is the previous block's hash (``b""`` for the first)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens))
    return h.digest()


@dataclass(eq=False)
class Snapshot:
    """A stored prompt prefix of ``end`` tokens: layer segments for tokens ``[start, end)``."""

    key: bytes
    start: int
    end: int
    tokens: tuple[int, ...]  # the prompt's tokens [start, end), checked on every hit
    segments: list[LayerState]
    nbytes: int
    parent: Snapshot | None
    children: int = 0
    marks: tuple[tuple[int, bytes], ...] = ()  # the images starting in [start, end), checked on a hit

    def chain(self) -> list[Snapshot]:
        """Nodes from the root to this one."""
        out, n = [], self
        while n is not None:
            out.append(n)
            n = n.parent
        return out[::-1]


@dataclass
class PrefixStats:
    lookups: int = 0  # requests that finished prefill with the prefix cache on
    hits: int = 0  # ... of which reused a snapshot
    tokens_reused: int = 0  # prompt tokens not prefilled thanks to a snapshot
    snapshots_stored: int = 0
    evictions: int = 0


class PrefixCache:
    """Snapshots of prompt prefixes under the engine's ``CacheBudget`` (see the module docstring)."""

    def __init__(
        self, budget: CacheBudget, block_size: int, device: torch.device, hash_fn: HashFn = block_hash
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"prefix_block_size: expected an integer >= 1, got {block_size!r}")
        self.budget, self.block_size, self.device, self.hash_fn = budget, block_size, device, hash_fn
        self.nodes: OrderedDict[bytes, Snapshot] = OrderedDict()  # least recently used first
        self.stats = PrefixStats()

    # ------------------------------------------------------------------ keys
    def hashes(self, ids: Sequence[int], marks: Sequence[tuple[int, bytes]] = ()) -> list[bytes]:
        """Chained hash of every full block of ``ids`` (``out[j]`` names the prefix ``ids[:(j+1)·bs]``);
        an image's digest joins the hash of the block holding its first patch (``marks``)."""
        bs, out, h = self.block_size, [], b""
        for j in range(len(ids) // bs):
            for pos, digest in marks:
                if j * bs <= pos < (j + 1) * bs:
                    h = hashlib.blake2b(h + digest, digest_size=16).digest()
            h = self.hash_fn(h, ids[j * bs : (j + 1) * bs])
            out.append(h)
        return out

    @staticmethod
    def _marks_in(marks: Sequence[tuple[int, bytes]], start: int, end: int) -> tuple[tuple[int, bytes], ...]:
        return tuple(m for m in marks if start <= m[0] < end)

    def last_boundary(self, n_prompt: int) -> int:
        """The longest reusable prefix of an ``n_prompt``-token prompt (one token must stay to prefill)."""
        return (n_prompt - 1) // self.block_size * self.block_size

    def _find(
        self, ids: Sequence[int], hashes: Sequence[bytes], end: int, marks: Sequence[tuple[int, bytes]] = ()
    ) -> Snapshot | None:
        """The stored node for ``ids[:end]`` (with images ``marks``), if any, verified token by token."""
        j = end // self.block_size
        if end % self.block_size or j < 1 or j > len(hashes):
            return None
        node = self.nodes.get(hashes[j - 1])
        if node is None or node.end != end:
            return None
        for n in node.chain():
            if tuple(ids[n.start : n.end]) != n.tokens or self._marks_in(marks, n.start, n.end) != n.marks:
                return None  # a hash collision: never hand one prompt another's state
        return node

    # ------------------------------------------------------------------ reuse and store
    def lookup(
        self,
        ids: Sequence[int],
        hashes: Sequence[bytes],
        longer_than: int = 0,
        marks: Sequence[tuple[int, bytes]] = (),
    ) -> tuple[int, Cache | None]:
        """The longest stored prefix of ``ids`` (at most ``last_boundary``, more than ``longer_than``
        tokens): ``(length, a fresh cache)``, or ``(0, None)``."""
        for end in range(self.last_boundary(len(ids)), longer_than, -self.block_size):
            node = self._find(ids, hashes, end, marks)
            if node is not None:
                chain = node.chain()
                for n in chain:
                    self.nodes.move_to_end(n.key)
                return end, Cache.from_segments([n.segments for n in chain], end, self.device)
        return 0, None

    def store(
        self,
        ids: Sequence[int],
        hashes: Sequence[bytes],
        cache: Cache,
        marks: Sequence[tuple[int, bytes]] = (),
    ) -> bool:
        """Snapshot the one-row ``cache`` (which has seen ``ids[:n]``) if ``n`` is a reusable boundary."""
        end = int(cache.seq_lens[0])
        if end % self.block_size or not 0 < end <= self.last_boundary(len(ids)):
            return False
        key = hashes[end // self.block_size - 1]
        if key in self.nodes:
            if self._find(ids, hashes, end, marks) is not None:
                self.nodes.move_to_end(key)
            return False  # stored already (or a colliding prefix owns the key: keep it)
        parent = None
        for e in range(end - self.block_size, 0, -self.block_size):
            parent = self._find(ids, hashes, e, marks)
            if parent is not None:
                break
        start = parent.end if parent is not None else 0
        segments = cache.segment(start, end)
        n = torch.tensor([end - start])
        nbytes = sum(s.nbytes(n) for s in segments)
        if not self.make_room(nbytes, keep=parent):
            return False
        tokens = tuple(ids[start:end])
        node = Snapshot(
            key, start, end, tokens, segments, nbytes, parent, marks=self._marks_in(marks, start, end)
        )
        if parent is not None:
            parent.children += 1
        self.nodes[key] = node
        self.budget.snapshot_bytes += nbytes
        self.stats.snapshots_stored += 1
        return True

    # ------------------------------------------------------------------ memory
    def evict_one(self, keep: Snapshot | None = None) -> bool:
        """Drop the least recently used snapshot that no other snapshot extends; False if none."""
        for key, node in self.nodes.items():
            if node.children == 0 and node is not keep:
                del self.nodes[key]
                if node.parent is not None:
                    node.parent.children -= 1
                self.budget.snapshot_bytes -= node.nbytes
                self.stats.evictions += 1
                return True
        return False

    def make_room(self, nbytes: int, keep: Snapshot | None = None) -> bool:
        """Evict until ``nbytes`` fit in the budget's free bytes; False (nothing evicted) if they cannot."""
        if nbytes > self.budget.free_bytes + self.budget.snapshot_bytes - (keep.nbytes if keep else 0):
            return False
        while nbytes > self.budget.free_bytes:
            if not self.evict_one(keep):
                return False
        return True

    def clear(self) -> None:
        while self.evict_one():
            pass

    # ------------------------------------------------------------------ scheduling
    def reuse(self, r: Request) -> None:
        """Start ``r`` from the longest stored prefix of its prompt, if longer than what it has."""
        n, cache = self.lookup(r.prompt_ids, r.block_hashes, longer_than=r.n_fed, marks=r.image_marks)
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
                        o.prefix_stops.add(s)
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
            n * self.block_size, self.last_boundary(len(b.prompt_ids)), self.last_boundary(len(a.prompt_ids))
        )

    def chunk(self, r: Request, n: int) -> int:
        """How many of ``n`` planned prompt tokens ``r`` should take so its chunk ends where a snapshot
        is wanted: at a stop another request waits for, at its last block boundary, or a block edge."""
        start, end = r.n_fed, r.n_fed + n
        stops = [s for s in (*r.prefix_stops, self.last_boundary(len(r.prompt_ids))) if start < s < end]
        if stops:
            return min(stops) - start
        if end < len(r.prompt_ids) and end // self.block_size * self.block_size > start:
            return end // self.block_size * self.block_size - start
        return n

    def report(self) -> dict[str, int]:
        s = self.stats
        return {
            "prefix_lookups": s.lookups,
            "prefix_hits": s.hits,
            "prefix_tokens_reused": s.tokens_reused,
            "prefix_snapshots": len(self.nodes),
            "prefix_snapshots_stored": s.snapshots_stored,
            "prefix_evictions": s.evictions,
            "prefix_snapshot_bytes": self.budget.snapshot_bytes,
        }

    def count(self, r: Request) -> None:
        """Record a request that finished prefill (``r.reused`` prompt tokens came from a snapshot)."""
        self.stats.lookups += 1
        self.stats.hits += r.reused > 0
        self.stats.tokens_reused += r.reused
