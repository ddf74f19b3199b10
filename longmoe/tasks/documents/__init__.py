"""Rendered documents with ground-truth JSON: the data of structured extraction (image in, JSON out).

``render(family, seed) -> Document``: a page drawn with Pillow's built-in fonts and random content
(nothing downloaded), the JSON object of what is on it, the same content as plain text (for a
text-only control), and the boxes where each value was drawn. Families, easiest first:

- ``form_easy``: 2-4 labelled fields of 3-5 characters on an 88-px wide grid aligned to 8-px patches,
  one clean bitmap font (made for a tiny model trained on CPU; see ``forms``);
- ``form_varied``: form_easy's content with its layout varied per page (offsets off the patch grid,
  row pitch, value column, three font faces/sizes, up to 2 degrees of rotation, pixel noise);
- ``form``: 3-7 typed fields in random order, varied fonts, positions and row pitch, faint noise;
- ``receipt``: store, date, 2-5 items with prices, total; noise and up to 3 degrees of rotation;
- ``table``: a ruled table of 2-4 rows x 2-3 columns; noise and rotation;
- ``figure_page``: a title and text around a bar or line chart with its caption; noise and rotation.

Everything is a pure function of ``(family, seed)``. Training draws seeds below
``HELD_OUT_SEED_BASE``; held-out renders use seeds from it up (``held_out_seeds``), never trained on.
The target a model produces is ``canonical_json(fields)``: sorted keys, no spaces, so exact match and
field-level scoring (``longmoe.eval.extract``) are well defined.

Not in the ``longmoe.tasks`` registry: that one holds long-context text tasks sized in tokens of a
tokenizer (``generate(task, n, length, ...)``); a document is sized in pixels and has no length.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from longmoe.tasks.base import TaskError
from longmoe.tasks.documents import forms, pages
from longmoe.tasks.documents.draw import MAX_SIDE, ROTATION_KEY, Box, Glyph, Page

HELD_OUT_SEED_BASE = 1_000_000_000  # training seeds stay below, held-out renders start here

Renderer = Callable[[random.Random], Page]
FAMILIES: dict[str, Renderer] = {
    "form_easy": forms.form_easy,
    "form_varied": forms.form_varied,
    "form": forms.form,
    "receipt": pages.receipt,
    "table": pages.table,
    "figure_page": pages.figure_page,
}
INSTRUCTION = "Fields as JSON:"  # short: a tiny character-level model reads it on every example

__all__ = [
    "FAMILIES",
    "HELD_OUT_SEED_BASE",
    "INSTRUCTION",
    "MAX_SIDE",
    "Box",
    "Glyph",
    "Document",
    "canonical_json",
    "documents",
    "held_out_seeds",
    "parse_families",
    "render",
    "train_seeds",
]


def canonical_json(obj: Any) -> str:
    """The one text form of a JSON value: sorted keys, compact separators, UTF-8 kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Document:
    """One rendered page and its truth. ``target`` is the JSON a model should answer with."""

    family: str
    seed: int
    image: Image.Image  # RGB, sides <= MAX_SIDE
    fields: dict[str, Any]
    text: str  # the same content as plain text (the text-only control's input)
    boxes: list[Box] = field(default_factory=list)  # where each value was drawn (before rotation)
    glyphs: list[Glyph] = field(default_factory=list)  # each drawn character's centre (after rotation)

    @property
    def target(self) -> str:
        return canonical_json(self.fields)

    @property
    def rotation(self) -> float:
        """Degrees the page was turned by (``draw.finish``; 0 for a page it did not turn)."""
        return float(self.image.info.get(ROTATION_KEY, 0.0))

    @property
    def held_out(self) -> bool:
        return self.seed >= HELD_OUT_SEED_BASE

    @property
    def doc_id(self) -> str:
        return f"{self.family}:{self.seed}"


def parse_families(spec: str | list[str] | None) -> list[str]:
    """``"form_easy,receipt"`` -> validated family names; None or ``"all"``: every family."""
    if spec is None or spec == "all":
        return list(FAMILIES)
    names = [f.strip() for f in (spec.split(",") if isinstance(spec, str) else spec) if f.strip()]
    if not names:
        raise TaskError(
            "no document family given: expected a comma-separated list from " + ", ".join(FAMILIES)
        )
    for f in names:
        if f not in FAMILIES:
            raise TaskError(f"unknown document family {f!r}: expected one of {', '.join(FAMILIES)}")
    return names


def render(family: str, seed: int) -> Document:
    """The document of ``family`` drawn from ``seed`` (same arguments, same pixels and truth)."""
    if family not in FAMILIES:
        raise TaskError(f"unknown document family {family!r}: expected one of {', '.join(FAMILIES)}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise TaskError(f"seed={seed!r} is invalid: expected a non-negative integer")
    rng = random.Random(f"longmoe-document:{family}:{seed}")
    image, fields, text, boxes, glyphs = FAMILIES[family](rng)
    return Document(family, seed, image.convert("RGB"), fields, text, boxes, glyphs)


def train_seeds(n: int, start: int = 0) -> range:
    """Seeds ``start .. start+n-1`` for training renders; refuses to reach the held-out range."""
    if n < 0 or start < 0 or start + n > HELD_OUT_SEED_BASE:
        raise TaskError(f"training seeds {start}..{start + n - 1} are invalid: expected 0 <= seed < "
                        f"{HELD_OUT_SEED_BASE} (the held-out range starts there)")  # fmt: skip
    return range(start, start + n)


def held_out_seeds(n: int, offset: int = 0) -> range:
    """Seeds of ``n`` held-out renders (``offset`` picks another disjoint block of them)."""
    if n < 0 or offset < 0:
        raise TaskError(f"held-out seeds n={n}, offset={offset} are invalid: expected non-negative integers")
    return range(HELD_OUT_SEED_BASE + offset, HELD_OUT_SEED_BASE + offset + n)


def documents(family: str, seeds: range | list[int]) -> list[Document]:
    return [render(family, s) for s in seeds]
