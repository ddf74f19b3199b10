"""Documents: the embedded standard-library corpus and loaders for a user's own text files.

The default corpus needs no download: it is the Python interpreter's own standard-library source,
read as whole files (``kind="file"``) or as per-package concatenations (``kind="package"``) that
reach tens of thousands of tokens, long enough for the long-window curriculum stages. The split into
train/validation is by *file* (a hash of its relative path), so a validation file never leaks into
training through its package concatenation either.

User data (``--data PATH``): a text file, a JSONL file (one object per line, ``text`` field), a
Parquet file (``text`` column), or a directory of those (walked in sorted order). A JSONL line may
instead hold an interleaved image-text document, ``{"segments": [{"text": "..."}, {"image":
"fig.png"}, ...]}``: an image is a path relative to the JSONL file or a ``data:image/...;base64,``
URI, decoded when the document is packed (``longmoe.data.images``, docs/train.md). Everything streams:
one document is in memory at a time. Text must be UTF-8: a file whose share of non-text bytes (bytes
that are not valid UTF-8, and NUL bytes) exceeds ``MAX_BINARY_SHARE`` is refused as binary; a smaller
share is read with U+FFFD in their place and a warning giving the share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from longmoe.errors import UserError

SPLITS = ("train", "val")
KINDS = ("file", "package")
VAL_FRACTION = 0.05  # share of files that go to the validation split
TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".text", ".c", ".h", ".js", ".ts", ".html", ".json", ".toml")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
# A text file in another encoding (Latin-1 prose: a few % of bytes) is read with a warning; a binary file
# (compressed data: ~50% invalid UTF-8; executables: mostly NUL bytes) is refused.
MAX_BINARY_SHARE = 0.10

log = logging.getLogger(__name__)

# Standard-library parts that are not prose-like source: generated tables, tests, binary-ish data.
_STDLIB_SKIP_DIRS = {
    "site-packages",
    "test",
    "tests",
    "idle_test",
    "lib-dynload",
    "__pycache__",
    "encodings",
    "ensurepip",
    "turtledemo",
}
_STDLIB_SKIP_PREFIXES = ("config-", "_sysconfigdata")


class DataError(UserError, ValueError):
    """A data path or corpus that cannot be used (missing, empty, unreadable)."""


@dataclass(frozen=True)
class ImageRef:
    """An image of an interleaved document, not yet read: ``uri`` is a ``data:`` URI or a path,
    relative paths resolved against ``base`` (the directory of the file that names it)."""

    uri: str
    base: str = "."


@dataclass(frozen=True)
class Document:
    """One training/eval document: its text and where it came from (a path, path:line, or a tag).

    ``loss_from`` (a character offset) makes ``text[:loss_from]`` context only: its tokens are read but
    not predicted, as in SFT prompt masking (task documents: learn the answer, not the filler).
    ``parts``: an interleaved image-text document, its text segments and images in order (``text`` is
    then the text segments joined, what a tokenizer is trained on).
    """

    text: str
    source: str
    loss_from: int | None = None
    parts: tuple[str | ImageRef, ...] | None = None


def split_of(key: str, val_fraction: float = VAL_FRACTION) -> str:
    """Deterministic train/val assignment of a file by the hash of its (relative) name."""
    h = int.from_bytes(hashlib.sha1(key.encode("utf-8")).digest()[:8], "big")
    return "val" if (h % 10_000) < val_fraction * 10_000 else "train"


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is invalid: expected one of {SPLITS}")


# ---------------------------------------------------------------------- standard library corpus
def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(split: str = "train") -> list[str]:
    """Relative paths (sorted) of the standard-library ``.py`` files in ``split``."""
    _check_split(split)
    root = stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(
            d for d in dirnames if d not in _STDLIB_SKIP_DIRS and not d.startswith(_STDLIB_SKIP_PREFIXES)
        )
        for f in sorted(filenames):
            if not f.endswith(".py") or f.startswith(_STDLIB_SKIP_PREFIXES):
                continue
            rel = os.path.normpath(os.path.join(rel_dir, f))
            if split_of(rel) == split:
                out.append(rel)
    if not out:
        raise DataError(f"no standard-library sources found under {root} (split={split!r})")
    return sorted(out)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def stdlib_packages(split: str = "train") -> list[tuple[str, list[str]]]:
    """``(package, files)`` groups: top-level directory name (or ``<top>`` for single modules)."""
    groups: dict[str, list[str]] = {}
    for rel in stdlib_files(split):
        parts = Path(rel).parts
        groups.setdefault(parts[0] if len(parts) > 1 else "<top>", []).append(rel)
    return sorted(groups.items())


def _package_text(files: list[str]) -> str:
    """Repository-style concatenation: each file introduced by a path header."""
    root = stdlib_root()
    return "".join(f"# ===== {rel} =====\n{_read(root / rel)}\n" for rel in files)


def stdlib_documents(
    split: str = "train", kind: str = "file", shuffle_seed: int | None = None, epoch: int = 0
) -> Iterator[Document]:
    """Real long documents from the interpreter's standard library.

    ``kind="file"``: one document per source file. ``kind="package"``: one document per top-level
    package (its files of this split concatenated; single modules form ``<top>`` chunks of ~16 files).
    ``shuffle_seed`` shuffles the order deterministically per ``epoch``; None keeps sorted order.
    """
    _check_split(split)
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is invalid: expected one of {KINDS}")
    root = stdlib_root()
    if kind == "file":
        items: list[tuple[str, list[str]]] = [(rel, [rel]) for rel in stdlib_files(split)]
    else:
        items = []
        for pkg, files in stdlib_packages(split):
            if pkg == "<top>":  # hundreds of independent modules: group them into chunks
                items += [(f"<top>[{i // 16}]", files[i : i + 16]) for i in range(0, len(files), 16)]
            else:
                items.append((pkg, files))
    if shuffle_seed is not None:
        random.Random(f"{shuffle_seed}:{epoch}").shuffle(items)
    for name, files in items:
        text = _read(root / files[0]) if kind == "file" else _package_text(files)
        yield Document(text=text, source=f"stdlib:{name}")


def stdlib_count(split: str = "train", kind: str = "file") -> int:
    """Number of documents ``stdlib_documents(split, kind)`` yields (cheap: no file reads)."""
    if kind == "file":
        return len(stdlib_files(split))
    n = 0
    for pkg, files in stdlib_packages(split):
        n += (len(files) + 15) // 16 if pkg == "<top>" else 1
    return n


# ---------------------------------------------------------------------- user data
def data_files(path: str | Path) -> list[Path]:
    """The readable files under ``path`` (a file or a directory), sorted; clear errors otherwise."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"--data path does not exist: {p}")
    suffixes = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES
    if p.is_file():
        return [p]
    files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in suffixes)
    if not files:
        raise DataError(
            f"--data directory {p} contains no text/JSONL/Parquet files "
            f"(looked for suffixes {', '.join(suffixes)})"
        )
    return files


def non_text_share(raw: bytes) -> float:
    """Share of ``raw`` that is not text: bytes that are invalid UTF-8, plus NUL bytes."""
    if not raw:
        return 0.0
    valid = len(raw.decode("utf-8", errors="ignore").encode("utf-8"))  # invalid bytes are dropped
    return (len(raw) - valid + raw.count(b"\0")) / len(raw)


_warned_files: set[Path] = set()  # warn about a file's bad bytes once, not on every epoch


def read_user_text(f: Path) -> str:
    """A user's text file as a string; refuses binary files and warns about a few undecodable bytes."""
    raw = f.read_bytes()
    share = non_text_share(raw)
    if share > MAX_BINARY_SHARE:
        raise DataError(
            f"--data file {f} looks binary: {share:.0%} of its bytes are not UTF-8 text "
            f"(more than {MAX_BINARY_SHARE:.0%}); give text, JSONL or Parquet files"
        )
    if share > 0 and f not in _warned_files:
        _warned_files.add(f)
        log.warning("--data file %s: %.2f%% of its bytes are not UTF-8 text; read as U+FFFD", f, 100 * share)
    return raw.decode("utf-8", errors="replace")


def _parquet_documents(f: Path, text_field: str) -> Iterator[Document]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:  # pragma: no cover - pyarrow is a dev dependency
        raise DataError(f"reading {f} needs pyarrow (pip install pyarrow)") from e
    try:
        pf = pq.ParquetFile(f)
        if text_field not in pf.schema_arrow.names:
            raise DataError(f"{f}: no column {text_field!r} (columns: {pf.schema_arrow.names})")
        row = 0
        for batch in pf.iter_batches(columns=[text_field], batch_size=256):
            for text in batch.column(0).to_pylist():
                row += 1
                if isinstance(text, str) and text:
                    yield Document(text=text, source=f"{f}:{row}")
    except (pa.ArrowException, OSError) as e:  # bad magic bytes, truncated footer or pages
        raise DataError(f"--data file {f} is not a readable Parquet file ({e})") from e


def segments_document(segments: object, source: str, base: str) -> Document | None:
    """The ``Document`` of an interleaved JSONL line's ``segments`` (None when it holds nothing);
    a ``DataError`` at ``source`` names the malformed segment."""
    if not isinstance(segments, list):
        raise DataError(f'{source}: "segments" must be a list, got {type(segments).__name__}')
    parts: list[str | ImageRef] = []
    for j, seg in enumerate(segments):
        ok = isinstance(seg, dict) and len(seg) == 1 and set(seg) <= {"text", "image"}
        value = next(iter(seg.values())) if ok else None
        if not isinstance(value, str):
            raise DataError(
                f'{source}: segments[{j}] = {str(seg)[:80]} is invalid: expected {{"text": "<string>"}} '
                'or {"image": "<path relative to the file, or a data:image/...;base64, URI>"}'
            )
        if "image" in seg:
            parts.append(ImageRef(value, base))
        elif value:
            parts.append(value)
    if not parts:
        return None
    return Document(text="".join(p for p in parts if isinstance(p, str)), source=source, parts=tuple(parts))


def _file_documents(f: Path, text_field: str) -> Iterator[Document]:
    suf = f.suffix.lower()
    if suf in JSONL_SUFFIXES:
        with f.open(encoding="utf-8", errors="replace") as fh:
            for i, line in enumerate(fh):
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{f}:{i + 1}: not valid JSON ({e})") from e
                if isinstance(obj, dict) and "segments" in obj:
                    doc = segments_document(obj["segments"], f"{f}:{i + 1}", str(f.parent))
                    if doc is not None:
                        yield doc
                    continue
                text = obj.get(text_field) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    raise DataError(
                        f"{f}:{i + 1}: expected an object with a string field {text_field!r} "
                        '(or a "segments" list of {"text": ...} / {"image": ...} objects)'
                    )
                if text:
                    yield Document(text=text, source=f"{f}:{i + 1}")
    elif suf in PARQUET_SUFFIXES:
        yield from _parquet_documents(f, text_field)
    else:
        text = read_user_text(f)
        if text:
            yield Document(text=text, source=str(f))


def load_documents(
    path: str | Path,
    split: str | None = None,
    text_field: str = "text",
    shuffle_seed: int | None = None,
    epoch: int = 0,
    val_fraction: float = VAL_FRACTION,
) -> Iterator[Document]:
    """Stream documents from a user's files. ``split`` keeps the train or val share (by file for whole
    text files, by file:row for JSONL/Parquet rows); ``shuffle_seed`` shuffles the *file* order per epoch."""
    if split is not None:
        _check_split(split)
    files = data_files(path)
    if shuffle_seed is not None:
        random.Random(f"{shuffle_seed}:{epoch}").shuffle(files)
    for f in files:
        for doc in _file_documents(f, text_field):
            if split is None or split_of(doc.source, val_fraction) == split:
                yield doc


def corpus_documents(
    data: str | Path | None = None,
    split: str = "train",
    kind: str = "file",
    shuffle_seed: int | None = None,
    epoch: int = 0,
) -> Iterator[Document]:
    """The default corpus (``data=None``: standard library) or a user's ``--data`` path."""
    if data is None:
        return stdlib_documents(split, kind, shuffle_seed, epoch)
    return load_documents(data, split, shuffle_seed=shuffle_seed, epoch=epoch)


def corpus_texts(
    data: str | Path | None = None, split: str = "train", max_chars: int | None = None
) -> Iterator[str]:
    """Document texts of the corpus in a fixed order, stopping once ``max_chars`` characters are out
    (for fitting a tokenizer or a baseline on a deterministic slice of a split)."""
    n = 0
    for doc in corpus_documents(data, split=split, kind="file", shuffle_seed=0, epoch=0):
        yield doc.text
        n += len(doc.text)
        if max_chars is not None and n >= max_chars:
            return
