"""Cache states: each kind's select / cat / clone / to / spec / nbytes / truncate, and a third kind."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import torch

from longmoe.cache import Cache, KDAState, LayerState, MLAState, StateSpec


def kda(B: int, seed: int = 0) -> KDAState:
    g = torch.Generator().manual_seed(seed)
    return KDAState(torch.randn(B, 2, 3, 3, generator=g), torch.randn(B, 2, 5, generator=g))


def mla(lens: list[int], seed: int = 0, cap: int | None = None) -> MLAState:
    """Rows left-aligned with random latents up to their length, zero padding after."""
    g = torch.Generator().manual_seed(seed)
    buf = torch.zeros(len(lens), cap or max(lens), 4)
    for b, n in enumerate(lens):
        buf[b, :n] = torch.randn(n, 4, generator=g)
    return MLAState(buf)


def rows_of(st: KDAState | MLAState, lens: list[int]) -> list[list[torch.Tensor]]:
    """Each row's valid content (MLA trimmed to its length), for comparisons independent of padding."""
    if isinstance(st, KDAState):
        return [[st.state[b], st.conv[b]] for b in range(len(lens))]
    return [[st.buf[b, :n]] for b, n in enumerate(lens)]


def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(torch.equal(u, v) for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("kind", ["kda", "mla"])
def test_select_cat_clone_round_trip(kind):
    lens = [5, 2, 7]
    st = kda(3) if kind == "kda" else mla(lens, cap=16)
    idx = torch.tensor([2, 0])
    sel = st.select(idx, 7)
    assert same(rows_of(sel, [7, 5]), [rows_of(st, lens)[2], rows_of(st, lens)[0]])
    singles = [st.select(torch.tensor([b]), n) for b, n in enumerate(lens)]
    back = type(st).cat(singles, max(lens))
    assert same(rows_of(back, lens), rows_of(st, lens))
    if kind == "mla":
        assert back.buf.shape[1] == 7 and singles[1].buf.shape[1] == 2  # trimmed, then padded with zeros
        assert back.buf[1, 2:].abs().sum() == 0
    c = st.clone(max(lens))
    assert same(rows_of(c, lens), rows_of(st, lens))
    (c.state if kind == "kda" else c.buf).add_(1)  # independent copies
    assert same(rows_of(st.to("cpu"), lens), rows_of(st, lens))
    assert not same(rows_of(c, lens), rows_of(st, lens))


def test_spec_and_nbytes():
    lens = torch.tensor([5, 2, 7])
    k, m = kda(3), mla([5, 2, 7], cap=64)
    assert k.spec() == StateSpec(fixed=(2 * 3 * 3 + 2 * 5) * 4)
    assert m.spec() == StateSpec(per_token=4 * 4)
    assert k.nbytes(lens) == 3 * k.spec().fixed
    assert m.nbytes(lens) == 14 * 16  # valid latents only, not the 64-slot capacity
    cache = Cache([k, m], lens)
    assert cache.spec() == k.spec() + m.spec()
    assert cache.nbytes() == k.nbytes(lens) + m.nbytes(lens)


def test_mla_truncate_and_kda_refuses():
    lens = [5, 2, 7]
    m = mla(lens, cap=8)
    before = m.buf.clone()
    cache = Cache([m], torch.tensor(lens))
    cache.truncate(4)
    assert cache.seq_lens.tolist() == [4, 2, 4]
    assert torch.equal(m.buf[:, :4], before[:, :4]) and m.buf[:, 4:].abs().sum() == 0
    cache.truncate(torch.tensor([1, 2, 4]))
    assert cache.seq_lens.tolist() == [1, 2, 4]
    with pytest.raises(ValueError, match="must be >= 0"):
        cache.truncate(-1)

    both = Cache([mla(lens), kda(3)], torch.tensor(lens))
    kept = both.layers[0].buf.clone()
    with pytest.raises(ValueError, match="recurrent state cannot forget tokens.*snapshot"):
        both.truncate(3)
    assert both.seq_lens.tolist() == lens and torch.equal(both.layers[0].buf, kept)  # nothing changed
    both.truncate(7)  # longer than every row: nothing to forget, allowed
    assert both.seq_lens.tolist() == lens


@dataclass
class CountState(LayerState):
    """A toy third kind: per row, a running token count (fixed) and one number per token."""

    count: torch.Tensor  # [B]
    hist: torch.Tensor  # [B, capacity]

    def select(self, idx: torch.Tensor, max_len: int) -> CountState:
        return CountState(self.count.index_select(0, idx), self.hist[:, :max_len].index_select(0, idx))

    @classmethod
    def cat(cls, states: Sequence[CountState], max_len: int) -> CountState:
        hist = [
            torch.nn.functional.pad(s.hist[:, :max_len], (0, max_len - s.hist[:, :max_len].shape[1]))
            for s in states
        ]
        return cls(torch.cat([s.count for s in states]), torch.cat(hist))

    def clone(self, max_len: int) -> CountState:
        return CountState(self.count.clone(), self.hist[:, :max_len].clone())

    def to(self, device: torch.device | str) -> CountState:
        return CountState(self.count.to(device), self.hist.to(device))

    def spec(self) -> StateSpec:
        return StateSpec(fixed=self.count.element_size(), per_token=self.hist.element_size())

    def truncate(self, seq_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        self.count.copy_(new_lens)


def test_cache_works_with_a_new_state_kind():
    def row(n: int, seed: int) -> Cache:
        return Cache(
            [kda(1, seed), mla([n], seed), CountState(torch.tensor([n]), torch.arange(n)[None].float())],
            torch.tensor([n]),
        )

    rows = [row(3, 0), row(6, 1), row(1, 2)]
    batch = Cache.stack(rows)
    assert batch.seq_lens.tolist() == [3, 6, 1]
    toy = batch.layers[2]
    assert isinstance(toy, CountState) and toy.count.tolist() == [3, 6, 1] and toy.hist.shape == (3, 6)
    assert batch.nbytes() == sum(r.nbytes() for r in rows)
    assert batch.spec() == rows[0].spec()
    back = batch.split()
    for a, b in zip(back, rows, strict=True):
        assert torch.equal(a.layers[2].hist, b.layers[2].hist) and torch.equal(
            a.layers[1].buf, b.layers[1].buf
        )
        assert torch.equal(a.layers[0].state, b.layers[0].state)
    picked = batch.select([1])
    assert picked.layers[2].count.tolist() == [6] and torch.equal(
        picked.layers[2].hist, rows[1].layers[2].hist
    )
    c = batch.clone().to("cpu")
    assert isinstance(c.layers[2], CountState) and torch.equal(c.layers[2].count, toy.count)
    only = Cache([CountState(torch.tensor([4, 2]), torch.ones(2, 4))], torch.tensor([4, 2]))
    only.truncate(3)
    assert only.layers[0].count.tolist() == [3, 2] and only.seq_lens.tolist() == [3, 2]


def test_stack_refuses_mixed_layouts():
    with pytest.raises(ValueError, match="same model"):
        Cache.stack([Cache([kda(1)], torch.tensor([1])), Cache([mla([1])], torch.tensor([1]))])
    with pytest.raises(ValueError, match="non-empty"):
        Cache.stack([])


def test_segments_rebuild_a_row_and_stay_unchanged():
    full = Cache([kda(1, 1), mla([10], 2, cap=16)], torch.tensor([10]))
    prefix = Cache([kda(1, 3), mla([10], 2, cap=16)], torch.tensor([10]))  # the same latents
    with pytest.raises(ValueError, match="has seen 10 tokens"):
        full.segment(0, 6)
    prefix.seq_lens = torch.tensor([6])
    first = prefix.segment(0, 6)
    second = full.segment(6, 10)
    assert first[1].buf.shape == (1, 6, 4) and second[1].buf.shape == (1, 4, 4)
    assert torch.equal(second[0].state, full.layers[0].state)  # the recurrent state as of token 10
    row = Cache.from_segments([first, second], 10, "cpu")
    assert row.seq_lens.tolist() == [10]
    assert same(rows_of(row.layers[1], [10]), rows_of(full.layers[1], [10]))
    assert same(rows_of(row.layers[0], [1]), rows_of(full.layers[0], [1]))
    kept = [t.clone() for t in (first[1].buf, second[1].buf, second[0].state)]
    row.layers[0].state.add_(1.0)
    row.layers[1].buf.add_(1.0)  # a restored row is a copy: mutating it leaves the segments alone
    assert all(
        torch.equal(a, b) for a, b in zip(kept, (first[1].buf, second[1].buf, second[0].state), strict=True)
    )


def test_mark_and_rewind_return_rows_to_their_marked_length():
    c = Cache([kda(3, 1), mla([4, 2, 5], 2, cap=8)], torch.tensor([4, 2, 5]))
    before = [[[t.clone() for t in r] for r in rows_of(st, [4, 2, 5])] for st in c.layers]
    m = c.mark()
    assert m.saved[1] is None and m.saved[0] is not None  # only the recurrent layer is copied
    # advance: the recurrent state changes, every row gains 2 latents
    c.layers[0].state.add_(5.0)
    c.layers[1].ensure_capacity(7)
    for b, n in enumerate([4, 2, 5]):
        c.layers[1].buf[b, n : n + 2] = 9.0
    c.seq_lens = c.seq_lens + 2
    back = c.rewind(m, [2, 0])
    assert back.seq_lens.tolist() == [5, 4]
    assert same(rows_of(back.layers[0], [5, 4]), [before[0][2], before[0][0]])
    assert same(rows_of(back.layers[1], [5, 4]), [before[1][2], before[1][0]])
    assert float(back.layers[1].buf[1, 4:].abs().sum()) == 0.0  # forgotten latents are zero padding
    assert c.seq_lens.tolist() == [6, 4, 7]  # the batch itself is unchanged


def test_capacity_buckets_hold_the_tokens_with_little_padding():
    """``capacity_bucket(n) >= n`` with less than ``max(n / 8, _MIN_CAPACITY)`` tokens of padding,
    monotone in ``n``, and few distinct values (16 an octave)."""
    from longmoe.cache import _MIN_CAPACITY, capacity_bucket

    caps = [capacity_bucket(n) for n in range(1, 70_000)]
    assert all(c >= n for n, c in zip(range(1, 70_000), caps))
    assert all(c - n < max(n / 8, _MIN_CAPACITY) for n, c in zip(range(1, 70_000), caps))
    assert caps == sorted(caps)
    assert len(set(caps)) < 16 * 11
