"""Streaming, resumable packing of tokenized documents into fixed windows with document boundaries.

Each document becomes ``[bos] + tokens + [eos]`` and is laid into windows back to back. A window
carries ``seg_lens``: the lengths of the document pieces in it, so the model gets ``cu_seqlens`` and
neither the KDA state nor MLA attention crosses a document. Labels are *pre-shifted*
(``labels[t]`` is the target of position ``t``); the last token of a document (its ``eos``) has
label -100 because its successor belongs to another document. A document cut by the window edge
keeps its true next-token label on the last position (same document), and continues as a fresh
segment in the next window. A document with ``loss_from`` has no targets before that point (its
context is read, not learned: SFT-style masking of task prompts).

Resuming needs no token buffer: the state is the document source's position *before* the current
document plus the offset into that document; restoring re-reads and re-tokenizes that one document.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from longmoe.config import IGNORE_INDEX
from longmoe.data.corpus import DataError, Document


class DocSource(Protocol):
    """An endless, deterministic document stream whose position can be saved and restored."""

    def next(self) -> Document: ...
    def state(self) -> dict[str, Any]: ...
    def restore(self, state: dict[str, Any]) -> None: ...


class StreamSource:
    """Wraps ``factory(epoch) -> Iterator[Document]`` into an endless stream of epochs.

    Restoring re-opens the epoch and skips the documents already consumed (raw text, no tokenization).
    """

    def __init__(self, factory: Callable[[int], Iterator[Document]], name: str = "stream") -> None:
        self.factory, self.name = factory, name
        self.epoch, self.idx = 0, 0
        self._it: Iterator[Document] | None = None

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "idx": self.idx}

    def restore(self, state: dict[str, Any]) -> None:
        self.epoch, self.idx = int(state["epoch"]), int(state["idx"])
        self._it = self.factory(self.epoch)
        for _ in range(self.idx):
            next(self._it)

    def next(self) -> Document:
        if self._it is None:
            self._it = self.factory(self.epoch)
        for _attempt in range(2):
            try:
                doc = next(self._it)
                self.idx += 1
                return doc
            except StopIteration:
                if self.idx == 0:
                    raise DataError(f"data source {self.name!r} is empty: it yielded no documents") from None
                self.epoch, self.idx = self.epoch + 1, 0
                self._it = self.factory(self.epoch)
        raise DataError(f"data source {self.name!r} is empty: it yielded no documents")


@dataclass
class Window:
    """One packed window: ``input_ids``/``labels`` of length W and the segment (document piece) lengths."""

    input_ids: list[int]  # [W]
    labels: list[int]  # [W], pre-shifted, -100 = no target
    seg_lens: list[int]  # sums to W


class Packer:
    """Packs documents from ``source`` into windows of any requested length (stages may change it)."""

    def __init__(
        self, source: DocSource, encode: Callable[[str], list[int]], bos_id: int, eos_id: int
    ) -> None:
        self.source, self.encode = source, encode
        self.bos_id, self.eos_id = bos_id, eos_id
        self._doc_state: dict[str, Any] = source.state()  # source position before the current doc
        self._cur: list[int] = []
        self._first_target = 1  # index in _cur of the first token that is a training target
        self._off = 0

    def _load_next(self) -> None:
        self._doc_state = self.source.state()
        doc = self.source.next()
        if doc.loss_from is None:
            body, self._first_target = self.encode(doc.text), 1
        else:  # tokenized in two parts, so the boundary is a token boundary (as when prompting)
            head = self.encode(doc.text[: doc.loss_from])
            body, self._first_target = head + self.encode(doc.text[doc.loss_from :]), 1 + len(head)
        self._cur = [self.bos_id] + body + [self.eos_id]
        self._off = 0

    def state(self) -> dict[str, Any]:
        return {"doc_state": self._doc_state, "offset": self._off, "loaded": bool(self._cur)}

    def restore(self, state: dict[str, Any]) -> None:
        self.source.restore(state["doc_state"])
        self._cur, self._off, self._doc_state = [], 0, state["doc_state"]
        if state["loaded"]:
            self._load_next()
            self._off = int(state["offset"])

    def next_window(self, length: int) -> Window:
        if length < 1:
            raise ValueError(f"window length={length} is invalid: expected a positive integer")
        ids: list[int] = []
        labels: list[int] = []
        segs: list[int] = []
        while len(ids) < length:
            if self._off >= len(self._cur):
                self._load_next()
            take = min(length - len(ids), len(self._cur) - self._off)
            end = self._off + take
            piece = self._cur[self._off : end]
            nxt = self._cur[end] if end < len(self._cur) else IGNORE_INDEX  # same doc or boundary
            ids += piece
            targets = piece[1:] + [nxt]  # target of _cur[j] is _cur[j + 1]
            skip = min(max(0, self._first_target - 1 - self._off), take)  # context-only positions
            labels += [IGNORE_INDEX] * skip + targets[skip:]
            segs.append(take)
            self._off = end
        return Window(ids, labels, segs)


def collate(windows: list[Window]) -> dict[str, torch.Tensor]:
    """Flatten windows into one packed row (B=1) with ``cu_seqlens`` over every segment of every window.

    Returns ``input_ids [1, N]``, ``labels [1, N]``, ``cu_seqlens [S+1]`` (int32) with N = Σ window lengths.
    """
    ids = [t for w in windows for t in w.input_ids]
    labels = [t for w in windows for t in w.labels]
    cu = [0]
    for w in windows:
        for s in w.seg_lens:
            cu.append(cu[-1] + s)
    return {
        "input_ids": torch.tensor([ids], dtype=torch.long),  # [1, N]
        "labels": torch.tensor([labels], dtype=torch.long),  # [1, N]
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),  # [S+1]
    }
