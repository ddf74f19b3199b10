"""Corpus: stdlib documents, deterministic file split, user-data loaders and their errors."""

from __future__ import annotations

import json

import pytest

from longmoe.data.corpus import (
    DataError,
    load_documents,
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
