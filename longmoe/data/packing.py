"""Streaming, resumable packing of tokenized documents into fixed windows with document boundaries.

Each document becomes ``[bos] + tokens + [eos]`` and is laid into windows back to back. A window
carries ``seg_lens``: the lengths of the document pieces in it, so the model gets ``cu_seqlens`` and
neither the KDA state nor MLA attention crosses a document. Labels are *pre-shifted*
(``labels[t]`` is the target of position ``t``); the last token of a document (its ``eos``) has
label -100 because its successor belongs to another document. A document cut by the window edge
keeps its true next-token label on the last position (same document), and continues as a fresh
segment in the next window. A document with ``loss_from`` has no targets before that point (its
context is read, not learned: SFT-style masking of task prompts).

Interleaved image-text documents (``Document.parts``, packed with an ``ImageLoader``): each image
becomes its token span (``<|image|>``, one ``<|image_patch|>`` per patch, ``<|/image|>``) and the
window carries the image's ``Patches``. A span is never cut by a window edge: when it does not fit
in the room left, the rest of the window is padding (its own segment, no targets) and the image
opens the next window, where the document continues as a fresh segment as at any window edge; an
image whose span is longer than a whole window is dropped (the text around it is kept, and
``dropped_images`` counts it). Targets that are image tokens are never trained (loss on text only).

Resuming needs no token buffer: the state is the document source's position *before* the current
document plus the offset into that document; restoring re-reads and re-tokenizes that one document
(re-decoding its images).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from longmoe.config import IGNORE_INDEX
from longmoe.data.batch import Batch
from longmoe.data.corpus import DataError, Document
from longmoe.data.images import ImageError, ImageLoader
from longmoe.types import Patches

log = logging.getLogger(__name__)


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
    images: list[Patches] = field(default_factory=list)  # the images whose spans are in the window, in order


class Packer:
    """Packs documents from ``source`` into windows of any requested length (stages may change it).

    ``images``: how to read the images of interleaved documents (None: a text-only model, which refuses
    them)."""

    def __init__(
        self,
        source: DocSource,
        encode: Callable[[str], list[int]],
        bos_id: int,
        eos_id: int,
        images: ImageLoader | None = None,
    ) -> None:
        self.source, self.encode = source, encode
        self.bos_id, self.eos_id = bos_id, eos_id
        self.images = images
        self._doc_state: dict[str, Any] = source.state()  # source position before the current doc
        self._cur: list[int] = []
        self._spans: list[tuple[int, int, Patches]] = []  # image spans of _cur: [start, end), patches
        self._mask_images = False  # whether image-token targets of _cur are masked
        self._first_target = 1  # index in _cur of the first token that is a training target
        self._off = 0
        self.dropped_images = 0  # images whose span was longer than the window (since construction)

    def _load_next(self) -> None:
        self._doc_state = self.source.state()
        doc = self.source.next()
        self._spans = []
        if doc.parts is not None:
            body, self._first_target = self._encode_parts(doc), 1
        elif doc.loss_from is None:
            body, self._first_target = self.encode(doc.text), 1
        else:  # tokenized in two parts, so the boundary is a token boundary (as when prompting)
            head = self.encode(doc.text[: doc.loss_from])
            body, self._first_target = head + self.encode(doc.text[doc.loss_from :]), 1 + len(head)
        if self.images is not None:
            in_spans = sum(e - s for s, e, _ in self._spans)
            if sum(t in self.images.ids for t in body) != in_spans:
                raise DataError(
                    f"{doc.source}: its text holds the image marker tokens (<|image|>, <|image_patch|>, "
                    "<|/image|>) as literal text, which a vision model reads as image positions: "
                    "remove them from the data"
                )
        self._mask_images = doc.parts is not None
        self._cur = [self.bos_id] + body + [self.eos_id]
        self._off = 0

    def _encode_parts(self, doc: Document) -> list[int]:
        """Tokens of an interleaved document; records its image spans (offsets in ``_cur``)."""
        if self.images is None:
            raise DataError(
                f"{doc.source}: an interleaved image-text document, but the model has no vision encoder "
                "(config field 'vision' is null): train a model with a vision config on it"
            )
        body: list[int] = []
        for part in doc.parts or ():
            if isinstance(part, str):
                body += self.encode(part)
                continue
            try:
                patches = self.images.load(part)
            except ImageError as e:
                raise DataError(f"{doc.source}: image {part.uri[:80]!r}: {e}") from e
            span = self.images.span(patches)
            start = 1 + len(body)  # + the document's bos
            self._spans.append((start, start + len(span), patches))
            body += span
        return body

    def state(self) -> dict[str, Any]:
        return {"doc_state": self._doc_state, "offset": self._off, "loaded": bool(self._cur)}

    def restore(self, state: dict[str, Any]) -> None:
        self.source.restore(state["doc_state"])
        self._cur, self._off, self._doc_state = [], 0, state["doc_state"]
        if state["loaded"]:
            self._load_next()
            self._off = int(state["offset"])

    def _cut_span(self, start: int, end: int) -> tuple[int, int] | None:
        """The image span that a piece ``_cur[start:end]`` would cut at its end, if any."""
        for s, e, _ in self._spans:
            if s < end < e:
                return s, e
        return None

    def next_window(self, length: int) -> Window:
        if length < 1:
            raise ValueError(f"window length={length} is invalid: expected a positive integer")
        ids: list[int] = []
        labels: list[int] = []
        segs: list[int] = []
        images: list[Patches] = []
        fresh = True  # the next piece opens a new segment (a new document, or a window's first piece)
        while len(ids) < length:
            if self._off >= len(self._cur):
                self._load_next()
                fresh = True
            room = length - len(ids)
            start = self._off
            end = min(len(self._cur), start + room)
            cut = self._cut_span(start, end)
            if cut is not None:
                s, e = cut
                if s > start:  # the text up to the image now, the image next
                    end = s
                elif e - s > length:  # longer than any window: drop the image, keep the text around it
                    self._off = e
                    self.dropped_images += 1
                    if self.dropped_images == 1:
                        log.warning(
                            "an image of %d tokens does not fit a window of %d: dropped (later ones too; "
                            "lower vision.max_image_side or raise the window)", e - s, length,
                        )  # fmt: skip
                    continue
                else:  # pad the rest of this window; the image opens the next one
                    ids += [self.images.pad_id if self.images else 0] * room
                    labels += [IGNORE_INDEX] * room
                    segs.append(room)
                    break
            take = end - start
            piece = self._cur[start:end]
            nxt = self._cur[end] if end < len(self._cur) else IGNORE_INDEX  # same doc or boundary
            targets = piece[1:] + [nxt]  # target of _cur[j] is _cur[j + 1]
            skip = min(max(0, self._first_target - 1 - start), take)  # context-only positions
            targets = [IGNORE_INDEX] * skip + targets[skip:]
            if self._mask_images:  # loss on text only
                ban = self.images.ids if self.images else frozenset()
                targets = [IGNORE_INDEX if t in ban else t for t in targets]
            ids += piece
            labels += targets
            images += [p for s, _, p in self._spans if start <= s < end]
            if fresh:
                segs.append(take)
                fresh = False
            else:  # the same document continues after a dropped image: one segment
                segs[-1] += take
            self._off = end
        return Window(ids, labels, segs, images)


def collate(windows: list[Window]) -> Batch:
    """Flatten windows into one packed row (B=1) with ``cu_seqlens`` over every segment of every window.

    A ``Batch`` of ``input_ids [1, N]``, ``labels [1, N]``, ``cu_seqlens [S+1]`` (int32) with
    N = Σ window lengths, the windows' ``Patches`` in row order (for ``LongMoE.encode_images``) and
    the windows' lengths (how a sharded step deals them to ranks).
    """
    ids = [t for w in windows for t in w.input_ids]
    labels = [t for w in windows for t in w.labels]
    cu = [0]
    for w in windows:
        for s in w.seg_lens:
            cu.append(cu[-1] + s)
    return Batch(
        input_ids=torch.tensor([ids], dtype=torch.long),  # [1, N]
        labels=torch.tensor([labels], dtype=torch.long),  # [1, N]
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),  # [S+1]
        images=[p for w in windows for p in w.images],
        window_lengths=tuple(len(w.input_ids) for w in windows),
    )
