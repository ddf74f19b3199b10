"""Per-sequence inference state and the token layout of a forward call.

A ``Cache`` holds, per layer, a ``LayerState``: what that layer needs to continue a sequence. Each
kind of state owns its behaviour (row selection, concatenation, copies, byte accounting, truncation),
so the ``Cache`` delegates without knowing the kinds and a new kind (a draft model's state, a vision
cache) is one new ``LayerState`` subclass. ``segment`` / ``from_segments`` cut a row into per-block
pieces and join them again (prefix reuse), ``mark`` / ``rewind`` return rows to an earlier length
(speculative decoding). Two kinds exist today:

- ``KDAState``: the fixed-size recurrent state ``[B, H, K, V]`` (fp32) plus the last ``conv_size - 1``
  conv inputs; the same size at 10 tokens or 1M (``StateSpec.fixed``);
- ``MLAState``: the cache row of every past token ``[B, T_cached, d_c + d_r]`` (model dtype): the latent
  ``c``, then the shared key part ``k_r`` when the layer has one (``mla_shared_key_dim = d_r``), growing
  by ``d_c + d_r`` numbers per token (``StateSpec.per_token``).

Rows are independent sequences of possibly different lengths (``seq_lens``): MLA rows are
left-aligned and zero-padded, and the per-row length masks the padding, so the serving engine can
``stack`` rows, decode one token for all of them and ``select`` / ``split`` them again (continuous
batching).

``Packing`` describes the other layout: several documents packed into one row (``cu_seqlens``), which
the layers must keep apart (KDA state reset + conv masking, block-diagonal MLA mask).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Self

import torch

_MIN_CAPACITY = 64  # initial MLA latent slots per row; grows by capacity buckets (1/16 octave)


BUCKETS_PER_OCTAVE = 16  # capacity buckets between consecutive powers of two (Cache.reserve)


def capacity_bucket(n: int) -> int:
    """The latent-buffer capacity ``Cache.reserve`` gives for ``n`` tokens: ``n`` rounded up to a
    multiple of ``2^⌈log2 n⌉ / BUCKETS_PER_OCTAVE`` (and at least ``_MIN_CAPACITY``).

    A compiled decode step attends over the whole reserved buffer (masked), so the padding is read at
    every step: power-of-two buckets read up to 2x the live cache (at 16K + 1 tokens, 32K rows).
    Sixteen buckets an octave keep that under 1/8, and cost nothing in compiles (the capacity is a
    symbolic dimension of the compiled graph) and little in copies (one reallocation per bucket:
    16 per doubling of the context)."""
    n = max(n, _MIN_CAPACITY)
    step = max(_MIN_CAPACITY, (1 << (n - 1).bit_length()) // BUCKETS_PER_OCTAVE)
    return -(-n // step) * step


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass(frozen=True)
class StateSpec:
    """Bytes one row of a state costs: ``fixed`` whatever its length, plus ``per_token`` per token."""

    fixed: int = 0
    per_token: int = 0

    def __add__(self, other: StateSpec) -> StateSpec:
        return StateSpec(self.fixed + other.fixed, self.per_token + other.per_token)


class LayerState(ABC):
    """One layer's inference state for ``B`` rows (row ``b`` has seen ``seq_lens[b]`` tokens).

    ``max_len`` arguments are the longest row length the result must hold; states whose size does not
    depend on length ignore it.

    ``forgets``: whether ``truncate`` can drop tokens (per-token states); a recurrent state cannot, and
    returning it to an earlier length needs a copy taken then (``Cache.mark`` / ``Cache.rewind``).
    """

    forgets: bool = True
    # a recurrent layer records ``(offset, state, ...)`` here during a forward call when this is a list
    # (``Cache.record_chunk_states``); per-token layers never need to
    chunk_states: list | None = None

    def chunk_state(self, entry: tuple) -> LayerState:
        """One row of a recorded chunk state (its row as a one-row state, copied); recurrent layers only."""
        raise NotImplementedError(f"{type(self).__name__} records no chunk states")

    @abstractmethod
    def select(self, idx: torch.Tensor, max_len: int) -> Self:
        """A new state (copied) with only rows ``idx [n]`` (int64, on the state's device)."""

    @classmethod
    @abstractmethod
    def cat(cls, states: Sequence[Self], max_len: int) -> Self:
        """The rows of ``states`` (same layer) concatenated into one state."""

    @abstractmethod
    def clone(self, max_len: int) -> Self:
        """An independent copy."""

    @abstractmethod
    def to(self, device: torch.device | str) -> Self: ...

    @abstractmethod
    def spec(self) -> StateSpec:
        """Bytes per row (fixed and per token)."""

    def reserve(self, capacity: int) -> None:
        """Make room for exactly ``capacity`` tokens per row, in place (states of fixed size: nothing)."""
        return None

    def nbytes(self, seq_lens: torch.Tensor) -> int:
        """Bytes of live state for rows of lengths ``seq_lens [B]`` (padding not counted)."""
        s = self.spec()
        return s.fixed * int(seq_lens.numel()) + s.per_token * int(seq_lens.sum())

    def check_truncate(self, seq_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        """Raise ``ValueError`` if ``truncate`` to ``new_lens`` is impossible (default: always possible)."""
        return None

    @abstractmethod
    def truncate(self, seq_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        """Forget tokens in place so row ``b`` holds ``new_lens[b] <= seq_lens[b]`` tokens."""

    def segment(self, start: int, end: int) -> Self:
        """A copy of what row 0 gained from tokens ``[start, end)`` (its state has seen ``end`` tokens).

        Per-token states copy those tokens; a recurrent state copies itself (it sums up all ``end``).
        ``from_segments`` of consecutive segments ``[0, e1), [e1, e2), ...`` rebuilds the row at ``e_n``
        (prefix reuse stores the segments of a prompt's blocks once and shares them).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot be cut into segments (prefix reuse)")

    @classmethod
    def from_segments(cls, segments: Sequence[Self]) -> Self:
        """One row holding consecutive ``segments`` (copied; the segments stay unchanged)."""
        raise NotImplementedError(f"{cls.__name__} cannot be joined from segments (prefix reuse)")


@dataclass
class KDAState(LayerState):
    """One KDA layer: recurrent state ``[B, H, K, V]`` fp32 and conv tail ``[B, W-1, C]``."""

    state: torch.Tensor
    conv: torch.Tensor
    forgets = False
    chunk_states: list | None = field(
        default=None, repr=False, compare=False
    )  # (offset, [B,H,K,V], [B,W-1,C])

    def chunk_state(self, entry: tuple) -> list[KDAState]:
        _, state, conv = entry
        return [
            KDAState(state[b : b + 1].clone(), conv[b : b + 1].clone(memory_format=torch.contiguous_format))
            for b in range(state.shape[0])
        ]

    def select(self, idx: torch.Tensor, max_len: int) -> KDAState:
        return KDAState(self.state.index_select(0, idx), self.conv.index_select(0, idx))

    @classmethod
    def cat(cls, states: Sequence[KDAState], max_len: int) -> KDAState:
        return cls(torch.cat([s.state for s in states]), torch.cat([s.conv for s in states]))

    def clone(self, max_len: int) -> KDAState:
        return KDAState(self.state.clone(), self.conv.clone())

    def to(self, device: torch.device | str) -> KDAState:
        return KDAState(self.state.to(device), self.conv.to(device))

    def spec(self) -> StateSpec:
        B = max(1, self.state.shape[0])
        return StateSpec(fixed=(_nbytes(self.state) + _nbytes(self.conv)) // B)

    def check_truncate(self, seq_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        if bool((new_lens < seq_lens).any()):
            raise ValueError(
                "KDAState.truncate: a recurrent state cannot forget tokens (it holds no per-token "
                "history); keep a snapshot of the state at the length to return to and restore it instead"
            )

    def truncate(self, seq_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        self.check_truncate(seq_lens, new_lens)  # only a no-op truncation gets here

    def segment(self, start: int, end: int) -> KDAState:
        return KDAState(self.state[:1].clone(), self.conv[:1].clone())

    @classmethod
    def from_segments(cls, segments: Sequence[KDAState]) -> KDAState:
        return segments[-1].clone(0)


@dataclass
class MLAState(LayerState):
    """One MLA layer: buffer ``[B, capacity, d_c + d_r]`` of cache rows ``[c | k_r]`` (latent, then the
    shared key part; ``d_r = 0`` without one); row ``b`` is valid up to ``seq_lens[b]``.

    Both parts live in one buffer, so selection, concatenation, segments, truncation and the byte count
    (``spec``: the whole row width) treat them alike."""

    buf: torch.Tensor

    def ensure_capacity(self, n: int) -> None:
        """Room for ``n`` tokens per row: the next capacity bucket (``capacity_bucket``: at most 1/8
        over ``n``), not a doubling, which at a 1M-token prompt would hold up to 2x the live latents."""
        cap = self.buf.shape[1]
        if n <= cap:
            return
        new_cap = capacity_bucket(n)
        buf = self.buf.new_zeros(self.buf.shape[0], new_cap, self.buf.shape[2])
        buf[:, :cap] = self.buf
        self.buf = buf

    def reserve(self, capacity: int) -> None:
        cap = self.buf.shape[1]
        if capacity == cap:
            return
        buf = self.buf.new_zeros(self.buf.shape[0], capacity, self.buf.shape[2])
        n = min(cap, capacity)
        buf[:, :n] = self.buf[:, :n]
        self.buf = buf

    def select(self, idx: torch.Tensor, max_len: int) -> MLAState:
        return MLAState(self.buf[:, :max_len].index_select(0, idx))

    @classmethod
    def cat(cls, states: Sequence[MLAState], max_len: int) -> MLAState:
        parts = []
        for s in states:
            b = s.buf[:, :max_len]
            if b.shape[1] < max_len:
                b = torch.cat([b, b.new_zeros(b.shape[0], max_len - b.shape[1], b.shape[2])], dim=1)
            parts.append(b)
        return cls(torch.cat(parts))

    def clone(self, max_len: int) -> MLAState:
        return MLAState(self.buf[:, :max_len].clone())

    def to(self, device: torch.device | str) -> MLAState:
        return MLAState(self.buf.to(device))

    def spec(self) -> StateSpec:
        return StateSpec(per_token=self.buf.shape[2] * self.buf.element_size())

    def truncate(self, seq_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        """Zero the cache rows past each row's new length (padding stays zero, as ``cat`` writes it)."""
        j = torch.arange(self.buf.shape[1], device=self.buf.device)
        self.buf.masked_fill_((j[None, :] >= new_lens.to(self.buf.device)[:, None])[:, :, None], 0)

    def segment(self, start: int, end: int) -> MLAState:
        return MLAState(self.buf[:1, start:end].clone())

    @classmethod
    def from_segments(cls, segments: Sequence[MLAState]) -> MLAState:
        return cls(torch.cat([s.buf for s in segments], dim=1))


@dataclass
class Cache:
    """Inference state of ``B`` rows for every layer; ``seq_lens [B]`` tokens seen per row."""

    layers: list[LayerState]
    seq_lens: torch.Tensor  # [B] int64

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.numel())

    @property
    def max_len(self) -> int:
        return int(self.seq_lens.max()) if self.batch_size else 0

    def nbytes(self) -> int:
        """Bytes of live state (each layer's own count; padding of shorter rows not included)."""
        return sum(st.nbytes(self.seq_lens) for st in self.layers)

    def spec(self) -> StateSpec:
        """Bytes per row of all layers together (fixed and per token)."""
        return sum((st.spec() for st in self.layers), StateSpec())

    def reserve(self, n: int) -> int:
        """Before a call of ``n`` tokens: give every growing state the capacity bucket that holds
        ``max_len + n`` tokens (``capacity_bucket``), so the buffer is reallocated once per bucket,
        not per token, as sequences grow and batches change. Returns the capacity."""
        cap = capacity_bucket(self.max_len + n)
        for st in self.layers:
            st.reserve(cap)
        return cap

    def advance(self, n: int) -> None:
        """Record that every row consumed ``n`` more tokens (called by the model after all layers)."""
        self.seq_lens = self.seq_lens + n

    def to(self, device: torch.device | str) -> Cache:
        return Cache([st.to(device) for st in self.layers], self.seq_lens.to(device))

    def clone(self) -> Cache:
        n = self.max_len
        return Cache([st.clone(n) for st in self.layers], self.seq_lens.clone())

    def select(self, rows: Sequence[int]) -> Cache:
        """A new cache (copied) with only ``rows``, in that order."""
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.seq_lens.device)
        seq_lens = self.seq_lens.index_select(0, idx)
        n = int(seq_lens.max()) if len(idx) else 0
        return Cache([st.select(idx, n) for st in self.layers], seq_lens)

    def split(self) -> list[Cache]:
        """One single-row cache per row (each copied and trimmed to its own length)."""
        return [self.select([b]) for b in range(self.batch_size)]

    def truncate(self, n: int | torch.Tensor) -> None:
        """Keep only the first ``n`` tokens of every row (``n`` an int or per row ``[B]``), in place.

        Rows already shorter keep their length. Raises ``ValueError`` for a layer whose state cannot
        forget tokens (KDA's recurrent state), leaving the cache unchanged.
        """
        new = torch.minimum(self.seq_lens, torch.as_tensor(n, dtype=torch.long, device=self.seq_lens.device))
        if bool((new < 0).any()):
            raise ValueError(f"Cache.truncate: n must be >= 0, got {n}")
        for st in self.layers:  # every layer agrees before any changes
            st.check_truncate(self.seq_lens, new)
        for st in self.layers:
            st.truncate(self.seq_lens, new)
        self.seq_lens = new

    def mark(self) -> CacheMark:
        """Remember the current lengths (and copies of the layers that cannot forget) for ``rewind``."""
        n = self.max_len
        return CacheMark(self.seq_lens.clone(), [None if st.forgets else st.clone(n) for st in self.layers])

    def rewind(self, mark: CacheMark, rows: Sequence[int]) -> Cache:
        """A new cache of ``rows`` as they were at ``mark`` (taken on this batch, before it advanced).

        Recurrent layers come from the mark's copies, per-token layers are truncated to the marked
        lengths; ``self`` is unchanged. Speculative decoding uses it to undo rejected draft tokens.
        """
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.seq_lens.device)
        seq_lens = mark.seq_lens.index_select(0, idx)
        n = int(seq_lens.max()) if len(idx) else 0
        layers = []
        for st, saved in zip(self.layers, mark.saved, strict=True):
            if saved is None:
                part = st.select(idx, n)
                part.truncate(self.seq_lens.index_select(0, idx), seq_lens)
            else:
                part = saved.select(idx, n)
            layers.append(part)
        return Cache(layers, seq_lens)

    def record_chunk_states(self) -> None:
        """Have every recurrent layer record its state at each chunk boundary inside the next forward
        call (``KDALayer`` takes them from the chunked scan): prefix reuse keeps states every few tokens
        without splitting the prefill into small calls."""
        for st in self.layers:
            if not st.forgets:
                st.chunk_states = []

    def take_chunk_states(self) -> list[dict[int, list[LayerState | None]]]:
        """What ``record_chunk_states`` recorded, per row: ``{offset in the call: per layer its state there}``
        (None for per-token layers, which keep every token anyway); only offsets that every recurrent
        layer recorded. Stops recording."""
        per_layer: list[dict[int, list[LayerState]] | None] = []
        for st in self.layers:
            if st.forgets or st.chunk_states is None:
                per_layer.append(None if st.forgets else {})
                continue
            per_layer.append({e[0]: st.chunk_state(e) for e in st.chunk_states})
            st.chunk_states = None
        rec = [d for d in per_layer if d is not None]
        offsets = set.intersection(*(set(d) for d in rec)) if rec else set()
        return [
            {p: [None if d is None else d[p][b] for d in per_layer] for p in sorted(offsets)}
            for b in range(self.batch_size)
        ]

    def segment(self, start: int, end: int) -> list[LayerState]:
        """Every layer's ``LayerState.segment`` of row 0 (which must have seen ``end`` tokens)."""
        if int(self.seq_lens[0]) != end:
            raise ValueError(f"Cache.segment: row 0 has seen {int(self.seq_lens[0])} tokens, not {end}")
        return [st.segment(start, end) for st in self.layers]

    @staticmethod
    def from_segments(
        segments: Sequence[Sequence[LayerState]], n_tokens: int, device: torch.device | str
    ) -> Cache:
        """A one-row cache from consecutive per-layer segments (``segments[j][i]``: block j, layer i)."""
        layers = [type(parts[0]).from_segments(parts) for parts in zip(*segments, strict=True)]
        return Cache(layers, torch.tensor([n_tokens], dtype=torch.long, device=device))

    @staticmethod
    def stack(caches: Sequence[Cache]) -> Cache:
        """Concatenate the rows of several caches (same model) into one batch."""
        if not caches:
            raise ValueError("Cache.stack: expected a non-empty list of caches")
        first = caches[0].layers
        for c in caches:
            if len(c.layers) != len(first) or any(
                type(a) is not type(b) for a, b in zip(c.layers, first, strict=True)
            ):
                raise ValueError("Cache.stack: all caches must come from the same model (layer layout)")
        seq_lens = torch.cat([c.seq_lens for c in caches])
        n = int(seq_lens.max()) if seq_lens.numel() else 0
        layers = [type(st).cat([c.layers[i] for c in caches], n) for i, st in enumerate(first)]
        return Cache(layers, seq_lens)


@dataclass
class CacheMark:
    """Lengths of a batch's rows and copies of its recurrent layers (``None`` for per-token ones)."""

    seq_lens: torch.Tensor
    saved: list[LayerState | None]


@dataclass
class Packing:
    """Documents packed in one row: ``cu_seqlens [N+1]`` offsets, derived per-token layout."""

    cu_seqlens: torch.Tensor  # [N+1] int64
    doc_pos: torch.Tensor = field(init=False)  # [T] position of each token inside its document
    doc_id: torch.Tensor = field(init=False)  # [T] document index of each token

    def __post_init__(self) -> None:
        cu = self.cu_seqlens.long()
        T = int(cu[-1])
        t = torch.arange(T, device=cu.device)
        self.doc_id = torch.searchsorted(cu[1:], t, right=True)  # [T]
        self.doc_pos = t - cu[self.doc_id]
