"""Corpus: stdlib documents, deterministic file split, user-data loaders and their errors."""

from __future__ import annotations

import json
import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longmoe.data.corpus import (
    DataError,
    load_documents,
    non_text_share,
    stdlib_count,
    stdlib_documents,
    stdlib_files,
)


def test_split_disjoint_and_deterministic() -> None:
    """Train and val files are disjoint, non-empty and identical across calls."""
    tr, va = stdlib_files("train"), stdlib_files("val")
    assert tr and va and not set(tr) & set(va)
    assert stdlib_files("val") == va


def test_package_docs_are_long_and_cover_split() -> None:
    """Package concatenations contain only their split's files and some reach 100K+ characters."""
    va = set(stdlib_files("val"))
    docs = list(stdlib_documents("val", "package"))
    assert len(docs) == stdlib_count("val", "package")
    body = "".join(d.text for d in docs)
    for rel in va:
        assert f"# ===== {rel} =====" in body
    train_long = max(len(d.text) for d in stdlib_documents("train", "package"))
    assert train_long > 100_000


def test_shuffle_is_seeded() -> None:
    """The same seed/epoch gives the same order; another epoch a different one."""
    a = [d.source for d in stdlib_documents("train", "file", shuffle_seed=1, epoch=0)]
    b = [d.source for d in stdlib_documents("train", "file", shuffle_seed=1, epoch=0)]
    c = [d.source for d in stdlib_documents("train", "file", shuffle_seed=1, epoch=1)]
    assert a == b and a != c and sorted(a) == sorted(c)


def test_user_data_formats(tmp_path) -> None:
    """Text, JSONL and Parquet files in a directory are all streamed as documents."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.txt").write_text("hello text")
    rows = json.dumps({"text": "row one"}) + "\n\n" + json.dumps({"text": "row two"})
    (tmp_path / "b.jsonl").write_text(rows)
    pq.write_table(pa.table({"text": ["pq one", "pq two"]}), tmp_path / "c.parquet")
    texts = [d.text for d in load_documents(tmp_path)]
    assert texts == ["hello text", "row one", "row two", "pq one", "pq two"]


def test_missing_and_empty_paths_are_clear(tmp_path) -> None:
    """A missing path and a directory without usable files raise DataError naming the path."""
    with pytest.raises(DataError, match="does not exist"):
        list(load_documents(tmp_path / "nope"))
    (tmp_path / "x.bin").write_bytes(b"\0")
    with pytest.raises(DataError, match="contains no"):
        list(load_documents(tmp_path))
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match="bad.jsonl:1"):
        list(load_documents(tmp_path / "bad.jsonl"))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_utf8_text_has_no_non_text_bytes(s: str) -> None:
    assert non_text_share(s.replace("\0", "").encode("utf-8")) == 0.0


@pytest.mark.parametrize(
    ("raw", "share"),
    [
        (b"", 0.0),
        (b"\0" * 10, 1.0),
        (b"ab\xffcd", 0.2),  # one invalid byte of five
        ("café".encode("latin-1"), 0.25),  # é in Latin-1 is not UTF-8
        (b"\xe2\x82", 1.0),  # a truncated 3-byte sequence
    ],
)
def test_non_text_share(raw: bytes, share: float) -> None:
    assert non_text_share(raw) == pytest.approx(share)


def test_binary_data_is_refused_and_a_few_bad_bytes_warn(tmp_path, caplog) -> None:
    """Above MAX_BINARY_SHARE non-text bytes a file is refused (naming it and the share); below, it is
    read with U+FFFD and one warning per file giving the share."""
    rng = random.Random(0)
    (tmp_path / "model.bin").write_bytes(rng.randbytes(10_000))
    (tmp_path / "zeros.txt").write_bytes(b"\0" * 100 + b"text")
    for name in ("model.bin", "zeros.txt"):
        with pytest.raises(DataError, match=rf"{name} looks binary: \d+% of its bytes"):
            list(load_documents(tmp_path / name))
    text = "plain text " * 100
    (tmp_path / "latin.txt").write_bytes(text.encode() + "é".encode("latin-1"))
    with caplog.at_level(logging.WARNING, logger="longmoe.data.corpus"):
        for _ in range(3):  # one warning, not one per epoch
            (doc,) = load_documents(tmp_path / "latin.txt")
    assert doc.text == text + "\ufffd"
    warnings = [r.getMessage() for r in caplog.records if "latin.txt" in r.getMessage()]
    assert len(warnings) == 1 and "0.09%" in warnings[0]


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated", "bad-magic"])
def test_corrupt_parquet_names_the_file(tmp_path, damage: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " * 50 for i in range(2000)]}), f)
    good = f.read_bytes()
    bad = {
        "garbage": b"PAR1" + random.Random(0).randbytes(len(good) - 8) + b"PAR1",
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "bad-magic": b"XXXX" + good[4:-4] + b"XXXX",
    }[damage]
    f.write_bytes(bad)
    with pytest.raises(DataError, match="rows.parquet is not a readable Parquet file"):
        list(load_documents(f))
