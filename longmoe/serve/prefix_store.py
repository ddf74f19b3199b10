"""Prefix reuse, the store: snapshots of token prefixes every ``block_size`` (16) tokens.

What to reuse and when to compute it is the admission policy's (``serve/prefix_policy.py``); this
file only keeps, finds and evicts snapshots, and is the only place that keeps the per-chunk states.
A recurrent (KDA) state cannot be cut at an arbitrary token, but the chunked prefill computes the
state after every 16-token chunk anyway: the runner has the cache record them
(``Cache.record_chunk_states``; ``StepOutput.chunk_states``), so a prefill chunk of any length leaves a
state at every block boundary inside it. A snapshot is a
chain node ``[start, end)``: the per-token layers' segment of those tokens (MLA latents, once) and,
per stored boundary ("point") in ``(start, end]``, only the recurrent layers' states. A hit at point
``p`` rebuilds a fresh row from the chain (``Cache.from_segments``, a copy: nothing a request does can
change a snapshot) and prefills only the rest; a new prefix that leaves a node in its middle splits it.
A finished request's row (prompt + reply) is kept too (``store_end``), ending off the grid: a chat's
next turn then prefills only its new message.

Keys are chained block hashes (as vLLM's): ``h_j = H(h_{j-1}, tokens of block j)``, so a point's key
names its whole prefix (a node ending off the grid hangs off the key of the boundary before it). A
hit is also checked token by token against the node's chain, so two prompts whose hashes collide
can never get each other's state. Images: identical token ids can carry different pixels, so
``marks`` (an image's first patch position and pixel digest,
``serve/prompt_images.py``) join the hash of the block holding that position and are checked on a
hit like the tokens.

Memory: snapshot bytes are accounted in the engine's ``CacheBudget`` (``snapshot_bytes``) and only
use what running requests have not reserved; least recently used leaves are evicted first, whenever a
snapshot or a request needs the room (a request never waits for snapshots).

"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
    """A stored stretch ``[start, end)`` of a token sequence, a node of a chain from the root.

    ``latents``: per layer, what a per-token layer holds for these tokens (``LayerState.segment``; None
    for recurrent layers); ``points``: per stored position ``p`` in ``(start, end]`` (every multiple of
    the block size the prefill's chunked scan passed, and ``end``), per layer the recurrent state after
    ``p`` tokens (None for per-token layers). So a node stores its latents once and only the small
    recurrent states per boundary, and a hit can stop at any of its points."""

    start: int
    end: int
    tokens: tuple[int, ...]  # the sequence's tokens [start, end), checked on every hit
    latents: list[LayerState | None]
    points: dict[int, list[LayerState | None]]
    nbytes: int
    parent: Snapshot | None
    children: int = 0
    marks: tuple[tuple[int, bytes], ...] = ()  # the images starting in [start, end), checked on a hit
    keys: dict[int, bytes] = field(default_factory=dict)  # point -> its key in SnapshotStore.index
    id: int = field(default_factory=lambda: next(_IDS))

    def chain(self) -> list[Snapshot]:
        """Nodes from the root to this one."""
        out, n = [], self
        while n is not None:
            out.append(n)
            n = n.parent
        return out[::-1]

    def segments(self, p: int) -> list[LayerState]:
        """Per layer, what this node contributes to a row of ``p`` tokens (``p`` one of its points)."""
        return [
            pt if lat is None else (lat if p == self.end else lat.segment(0, p - self.start))
            for lat, pt in zip(self.latents, self.points[p], strict=True)
        ]  # type: ignore[misc]

    def measure(self) -> int:
        one = torch.tensor([1])
        n = sum(s.nbytes(torch.tensor([self.end - self.start])) for s in self.latents if s is not None)
        return n + sum(s.nbytes(one) for pt in self.points.values() for s in pt if s is not None)


_IDS = itertools.count()


@dataclass
class PrefixStats:
    lookups: int = 0  # requests that finished prefill with the prefix cache on
    hits: int = 0  # ... of which reused a snapshot
    tokens_reused: int = 0  # prompt tokens not prefilled thanks to a snapshot
    snapshots_stored: int = 0
    evictions: int = 0


class SnapshotStore:
    """Snapshots of token prefixes under the engine's ``CacheBudget`` (see the module docstring)."""

    def __init__(
        self, budget: CacheBudget, block_size: int, device: torch.device, hash_fn: HashFn = block_hash
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"prefix_block_size: expected an integer >= 1, got {block_size!r}")
        self.budget, self.block_size, self.device, self.hash_fn = budget, block_size, device, hash_fn
        self.nodes: OrderedDict[int, Snapshot] = OrderedDict()  # least recently used first
        self.index: dict[bytes, tuple[Snapshot, int]] = {}  # block hash of a prefix -> (node, point)
        self.tails: dict[bytes, list[Snapshot]] = {}  # block hash at b -> nodes ending in (b, b + bs)
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
        """The longest block-aligned reusable prefix of an ``n_prompt``-token prompt (one token must stay
        to prefill)."""
        return (n_prompt - 1) // self.block_size * self.block_size

    def _base(self, hashes: Sequence[bytes], b: int) -> bytes:
        return hashes[b // self.block_size - 1] if b else b""

    def _verify(self, ids: Sequence[int], node: Snapshot, p: int, marks: Sequence[tuple[int, bytes]]) -> bool:
        """Whether ``ids[:p]`` (with images ``marks``) is exactly what ``node``'s chain stored, token by
        token: a hash collision must never hand one prompt another's state."""
        for n in node.chain():
            upto = min(n.end, p)
            if tuple(ids[n.start : upto]) != n.tokens[: upto - n.start]:
                return False
            if self._marks_in(marks, n.start, upto) != tuple(m for m in n.marks if m[0] < upto):
                return False
        return True

    def _search(
        self,
        ids: Sequence[int],
        hashes: Sequence[bytes],
        limit: int,
        longer_than: int = 0,
        marks: Sequence[tuple[int, bytes]] = (),
    ) -> tuple[Snapshot, int] | None:
        """The longest stored point ``p`` of ``ids`` with ``longer_than < p <= limit``: ``(node, p)``.

        Block-aligned points are found by their chained hash; a node ending between two block boundaries
        (a finished request's end) hangs off the hash of the boundary before it (``tails``)."""
        bs = self.block_size
        for b in range(min(limit, len(hashes) * bs) // bs * bs, -1, -bs):
            if b + bs <= longer_than:
                break
            best: tuple[Snapshot, int] | None = None
            for node in self.tails.get(self._base(hashes, b), ()):
                longer = longer_than < node.end <= limit and (best is None or node.end > best[1])
                if longer and self._verify(ids, node, node.end, marks):
                    best = (node, node.end)
            if best is None and b > longer_than:
                hit = self.index.get(hashes[b // bs - 1]) if b else None
                if hit is not None and hit[1] == b and self._verify(ids, hit[0], b, marks):
                    best = hit
            if best is not None:
                return best
        return None

    # ------------------------------------------------------------------ reuse and store
    def lookup(
        self,
        ids: Sequence[int],
        hashes: Sequence[bytes],
        longer_than: int = 0,
        marks: Sequence[tuple[int, bytes]] = (),
    ) -> tuple[int, Cache | None]:
        """The longest stored prefix of ``ids`` (at most ``len(ids) - 1`` tokens, more than
        ``longer_than``): ``(length, a fresh cache)``, or ``(0, None)``."""
        found = self._search(ids, hashes, len(ids) - 1, longer_than, marks)
        if found is None:
            return 0, None
        node, p = found
        chain = node.chain()
        for n in chain:
            self.nodes.move_to_end(n.id)
        segs = [n.segments(n.end) for n in chain[:-1]] + [node.segments(p)]
        return p, Cache.from_segments(segs, p, self.device)

    def store(
        self,
        ids: Sequence[int],
        hashes: Sequence[bytes],
        cache: Cache,
        marks: Sequence[tuple[int, bytes]] = (),
        states: dict[int, list[LayerState | None]] | None = None,
        final: bool = False,
    ) -> bool:
        """Snapshot the one-row ``cache`` (which has seen ``ids[:n]``) at its reusable positions: the
        block multiples among ``states`` (states the prefill recorded inside its last call,
        ``Cache.take_chunk_states``) and ``n`` itself when block-aligned, or whatever it is when ``final``
        (``ids`` then is exactly the ``n`` tokens a finished request's row has seen)."""
        bs, n = self.block_size, int(cache.seq_lens[0])
        limit = n if final else min(n, self.last_boundary(len(ids)))
        pts = {p: st for p, st in (states or {}).items() if p % bs == 0 and 0 < p <= limit}
        if n <= limit and (final or n % bs == 0):
            pts[n] = [None if st.forgets else st.segment(n, n) for st in cache.layers]
        if not pts:
            return False
        end = max(pts)
        found = self._search(ids, hashes, end, 0, marks)
        if found is not None and found[1] == end:  # stored already (or a colliding prefix owns the key)
            for m in found[0].chain():
                self.nodes.move_to_end(m.id)
            return False
        parent = None if found is None else self._split(*found)
        start = 0 if parent is None else parent.end
        node = Snapshot(
            start,
            end,
            tuple(ids[start:end]),
            [st.segment(start, end) if st.forgets else None for st in cache.layers],
            {p: st for p, st in sorted(pts.items()) if p > start},
            0,
            parent,
            marks=self._marks_in(marks, start, end),
        )
        node.nbytes = node.measure()
        if not self.make_room(node.nbytes, keep=parent):
            return False
        if parent is not None:
            parent.children += 1
        self.nodes[node.id] = node
        self._register(node, hashes)
        self.budget.snapshot_bytes += node.nbytes
        self.stats.snapshots_stored += 1
        return True

    def store_end(self, r: Request, cache: Cache) -> bool:
        """Keep a finished request's row (prompt + every generated token but the last, which it has not
        fed): the next turn of a chat (this conversation + a new message) then prefills only the new
        message."""
        seq = (r.prompt_ids + r.out)[: int(cache.seq_lens[0])]
        if len(seq) != int(cache.seq_lens[0]) or not seq:
            return False
        return self.store(seq, self.hashes(seq, r.image_marks), cache, r.image_marks, final=True)

    def _register(self, node: Snapshot, hashes: Sequence[bytes]) -> None:
        bs = self.block_size
        for p in node.points:
            if p % bs == 0:
                k = hashes[p // bs - 1]
                if k not in self.index:  # a colliding prefix may own the key: keep it
                    self.index[k] = (node, p)
                    node.keys[p] = k
        if node.end % bs:
            self.tails.setdefault(self._base(hashes, node.end // bs * bs), []).append(node)
            node.keys[-1] = self._base(hashes, node.end // bs * bs)

    def _split(self, node: Snapshot, q: int) -> Snapshot:
        """The node ending at ``q`` (a point of ``node``): ``node`` itself, or its first part split off
        (a new parent holding ``[start, q)``; ``node`` keeps ``[q, end)``, so its children stay valid)."""
        if q == node.end:
            return node
        k = q - node.start
        head = Snapshot(
            node.start,
            q,
            node.tokens[:k],
            [None if s is None else s.segment(0, k) for s in node.latents],
            {p: s for p, s in node.points.items() if p <= q},
            0,
            node.parent,
            children=1,
            marks=tuple(m for m in node.marks if m[0] < q),
        )
        head.keys = {p: key for p, key in node.keys.items() if 0 < p <= q}
        for p, key in head.keys.items():
            self.index[key] = (head, p)
        before, length = node.nbytes, node.end - node.start
        node.start, node.tokens, node.parent = q, node.tokens[k:], head
        node.latents = [None if s is None else s.segment(k, length) for s in node.latents]
        node.points = {p: s for p, s in node.points.items() if p > q}
        node.keys = {p: key for p, key in node.keys.items() if p > q or p == -1}
        node.marks = tuple(m for m in node.marks if m[0] >= q)
        head.nbytes, node.nbytes = head.measure(), node.measure()
        self.budget.snapshot_bytes += head.nbytes + node.nbytes - before
        self.nodes[head.id] = head
        self.nodes.move_to_end(node.id)
        return head

    # ------------------------------------------------------------------ memory
    def evict_one(self, keep: Snapshot | None = None) -> bool:
        """Drop the least recently used snapshot that no other snapshot extends; False if none."""
        for node in self.nodes.values():
            if node.children == 0 and node is not keep:
                self._drop(node)
                self.stats.evictions += 1
                return True
        return False

    def _drop(self, node: Snapshot) -> None:
        del self.nodes[node.id]
        for p, k in node.keys.items():
            if p == -1:
                self.tails[k] = [t for t in self.tails.get(k, ()) if t is not node]
                if not self.tails[k]:
                    del self.tails[k]
            elif self.index.get(k, (None, 0))[0] is node:
                del self.index[k]
        if node.parent is not None:
            node.parent.children -= 1
        self.budget.snapshot_bytes -= node.nbytes

    def forget(self, salt: bytes) -> int:
        """Drop every snapshot whose prefix was stored under ``salt`` (the mark ``(0, salt)`` of
        ``Request.image_marks``), leaves first; the number dropped."""
        n = 0
        while doomed := [
            nd for nd in self.nodes.values() if nd.children == 0 and (0, salt) in nd.chain()[0].marks
        ]:
            for nd in doomed:
                self._drop(nd)
                n += 1
        return n

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

    def count(self, reused: int) -> None:
        """Record a request that finished prefill (``reused`` prompt tokens came from a snapshot)."""
        self.stats.lookups += 1
        self.stats.hits += reused > 0
        self.stats.tokens_reused += reused
