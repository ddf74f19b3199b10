"""Packing: windows never cross documents, labels are the in-document next token, resume is exact."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longmoe.config import IGNORE_INDEX
from longmoe.data.corpus import DataError, Document
from longmoe.data.packing import Packer, StreamSource, collate
from tests.helpers.tokenizer import tokenizer_for_tests

BOS, EOS = 1, 2


def _docs(lengths: list[int]) -> StreamSource:
    """Documents whose tokens encode (doc index, position) so crossings are detectable."""

    def factory(epoch: int) -> Iterator[Document]:
        for d, n in enumerate(lengths):
            yield Document(text=" ".join(f"{d}.{j}" for j in range(n)), source=f"d{d}:e{epoch}")

    return StreamSource(factory)


def _encode(text: str) -> list[int]:  # token = 1000 * (doc + 1) + position, from "doc.pos" words
    return [1000 * (int(w.split(".")[0]) + 1) + int(w.split(".")[1]) for w in text.split()]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(1, 37), st.integers(1, 12))
def test_windows_never_cross_documents(lengths: list[int], window: int, n: int) -> None:
    """Each segment holds tokens of one document only; labels are that document's next token or -100."""
    p = Packer(_docs(lengths), _encode, BOS, EOS)
    for _ in range(n):
        w = p.next_window(window)
        assert len(w.input_ids) == len(w.labels) == window == sum(w.seg_lens)
        off = 0
        for s in w.seg_lens:
            seg, lab = w.input_ids[off : off + s], w.labels[off : off + s]
            docs = {t // 1000 for t in seg if t >= 1000}
            assert len(docs) <= 1
            for j, t in enumerate(seg):
                nxt = lab[j]
                if t == EOS:
                    assert nxt == IGNORE_INDEX  # boundary: never predict the next document
                elif nxt != IGNORE_INDEX and nxt not in (EOS,):
                    assert nxt // 1000 == (t // 1000 if t >= 1000 else nxt // 1000)
                    if t >= 1000:
                        assert nxt == t + 1
                if j + 1 < s:
                    assert nxt == seg[j + 1]
            off += s


def test_collate_cu_seqlens() -> None:
    """collate flattens windows into one row whose cu_seqlens covers every segment of every window."""
    p = Packer(_docs([5, 3, 9]), _encode, BOS, EOS)
    ws = [p.next_window(6), p.next_window(4)]
    b = collate(ws)
    assert b.input_ids.shape == b.labels.shape == (1, 10)
    cu = b.cu_seqlens.tolist()
    assert cu[0] == 0 and cu[-1] == 10 and 6 in cu
    assert cu == sorted(cu)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=6), st.integers(1, 20), st.integers(0, 15))
def test_resume_reproduces_stream(lengths: list[int], window: int, k: int) -> None:
    """A packer restored from the state after k windows yields the windows an uninterrupted one does."""
    a = Packer(_docs(lengths), _encode, BOS, EOS)
    for _ in range(k):
        a.next_window(window)
    st_ = a.state()
    ref = [a.next_window(window).input_ids for _ in range(5)]
    b = Packer(_docs(lengths), _encode, BOS, EOS)
    b.restore(st_)
    assert [b.next_window(window).input_ids for _ in range(5)] == ref


def test_resume_with_real_tokenizer_and_epochs() -> None:
    """Resume on the real stdlib stream (tokenized, shuffled by seed) reproduces the same sample."""
    from longmoe.train.mix import make_source

    tok = tokenizer_for_tests()
    a = Packer(make_source("file", "val", seed=3), tok.encode, tok.bos_id, tok.eos_id)
    for _ in range(3):
        a.next_window(512)
    state = a.state()
    ref = a.next_window(512)
    b = Packer(make_source("file", "val", seed=3), tok.encode, tok.bos_id, tok.eos_id)
    b.restore(state)
    assert b.next_window(512) == ref


def test_empty_source_is_clear_error() -> None:
    """A source with no documents raises DataError instead of looping forever."""
    p = Packer(StreamSource(lambda e: iter(()), name="empty"), _encode, BOS, EOS)
    with pytest.raises(DataError, match="empty"):
        p.next_window(4)


def _masked_docs(lengths: list[int], heads: list[int]) -> StreamSource:
    """Like ``_docs``, but the first ``heads[d]`` words of document d are context only (``loss_from``)."""

    def factory(epoch: int) -> Iterator[Document]:
        for d, (n, h) in enumerate(zip(lengths, heads)):
            words = [f"{d}.{j}" for j in range(n)]
            head = " ".join(words[:h]) + (" " if h else "")
            yield Document(text=head + " ".join(words[h:]), source=f"d{d}", loss_from=len(head))

    return StreamSource(factory)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30)), min_size=1, max_size=6),
    st.integers(1, 23),
)
def test_loss_from_masks_exactly_the_context(docs: list[tuple[int, int]], window: int) -> None:
    """Tokens of ``text[:loss_from]`` are never targets, every later token is, whatever the window cuts."""
    lengths = [n for n, _ in docs]
    heads = [min(h, n) for n, h in docs]
    p = Packer(_masked_docs(lengths, heads), _encode, BOS, EOS)
    targets: list[int] = []
    total = sum(n + 2 for n in lengths)  # one pass over the documents, bos + tokens + eos each
    while len(targets) < 2 * total:
        w = p.next_window(window)
        targets += [t for t in w.labels if t != IGNORE_INDEX]
    want: list[int] = []
    for d, (n, h) in enumerate(zip(lengths, heads)):
        want += [1000 * (d + 1) + j for j in range(h, n)] + [EOS]  # the answer part, then its eos
    assert targets[: len(want)] == want


def test_loss_from_none_and_zero_train_on_everything() -> None:
    """No ``loss_from`` and ``loss_from=0`` give the same labels (all next tokens)."""
    a = Packer(_docs([7, 4]), _encode, BOS, EOS).next_window(13)
    b = Packer(_masked_docs([7, 4], [0, 0]), _encode, BOS, EOS).next_window(13)
    assert a.labels == b.labels and a.input_ids == b.input_ids
