"""Forms: labelled fields. ``form_easy`` is built to be read by a tiny model; ``form`` is a real-looking one.

``form_easy`` (8n x 88 px for n fields, the bitmap font only, no noise): 2-4 fields, one per 8-px row, labels
from a pool of eight short lower-case words drawn exactly as their JSON keys (so reading a key is
copying it, like a value), values 3-5 characters of ``A-Z0-9``. Every character is
drawn in its own 8 x 8 cell of a fixed-pitch grid aligned to the 8-px patch grid (the default
``VisionConfig.patch_size``): the label from column 0, a colon after it, the value from column
``EASY_VALUE_COL``. So each glyph lands whole in one patch at the same offset every time, and a linear
patch projector sees one clean character per patch (in effect a character embedding); the fields are
drawn in the order of their keys, so the JSON (sorted keys) reads the page top to bottom.

``form_varied`` (about 60-130 x 35-100 px): form_easy's content (the same labels drawn as their keys, the
same values, key order top to bottom) with its layout varied per page: a random page offset that is not
aligned to the 8-px patch grid, so a glyph straddles patches at a different offset on every page; a
random row pitch and value column; one of Pillow's built-in fonts per page (the 6x11 bitmap font, or
the vector font at 10 or 12 px where FreeType is present, with their own proportional advances);
rotation within +-2 degrees and Gaussian pixel noise. It asks whether a tiny model reads glyphs, not
grid cells.

``form`` (up to 256 x 256): 3-7 fields in random order from a larger pool of labels with typed values
(names, dates, phone numbers, amounts, codes, places), one font drawn per page from the bitmap font
and the vector font at 10-13 px, random margins, row pitch and value column; faint noise.
"""

from __future__ import annotations

import random
from typing import Any

from longmoe.tasks.base import NOUNS, PLACES
from longmoe.tasks.documents.draw import (
    ALNUM,
    DIGITS,
    MAX_SIDE,
    UPPER,
    Box,
    Canvas,
    Font,
    Page,
    bitmap_font,
    code,
    finish,
    has_freetype,
    line_height,
    money,
    text_size,
    varied_fonts,
    vector_font,
)

EASY_CELL = 8  # grid pitch in px = the patch size the layout is aligned to
EASY_ROWS, EASY_COLS = 4, 11  # at most 4 rows; 88 px wide (label, colon, blank, up to 5 value cells)
# drawn as they are keyed; no descenders (g, j, p, q, y would reach below the 8-px cell)
EASY_LABELS = ("box", "code", "fee", "id", "lot", "name", "ref", "unit")
EASY_VALUE_COL = 6  # values start at this column (labels are at most 4 characters + a colon)
EASY_VALUE_LEN = (3, 5)
_BITMAP_INK_TOP = 2  # the bitmap font's glyphs have ink in rows 2..8 of their 11-px cell


def easy_cell_origin(row: int, col: int) -> tuple[int, int]:
    """Where to draw a glyph of the bitmap font so that its ink (6 x 7 px) sits inside cell (row, col)."""
    return col * EASY_CELL + 1, row * EASY_CELL - _BITMAP_INK_TOP


def form_easy(rng: random.Random) -> Page:
    n = rng.randint(2, EASY_ROWS)
    labels = sorted(rng.sample(EASY_LABELS, n))
    canvas = Canvas(EASY_COLS * EASY_CELL, n * EASY_CELL)  # one 8-px row per field: 16 to 44 patches
    font = bitmap_font()
    fields: dict[str, Any] = {}
    lines = []
    for row, label in enumerate(labels):
        value = code(rng, *EASY_VALUE_LEN)
        key = label
        for col, ch in enumerate(label + ":"):
            canvas.text(easy_cell_origin(row, col), ch, font)
        for j, ch in enumerate(value):
            canvas.text(easy_cell_origin(row, EASY_VALUE_COL + j), ch, font)
        cells = (EASY_VALUE_COL * EASY_CELL, row * EASY_CELL, (EASY_VALUE_COL + len(value)) * EASY_CELL,
                 (row + 1) * EASY_CELL)  # fmt: skip
        canvas.boxes.append(Box(key, value, cells))  # the value's grid cells
        fields[key] = value
        lines.append(f"{label}: {value}")
    return canvas.image, fields, "\n".join(lines), canvas.boxes, canvas.glyphs


# ---------------------------------------------------------------------- form_varied
VARIED_VECTOR_SIZES = (10, 12)  # the vector font's sizes (with the bitmap font: 3 faces and sizes)
VARIED_MAX_DEGREES = 2.0
VARIED_MAX_NOISE = 8.0  # standard deviation of the pixel noise, 0..255 units, drawn per page


def varied_form_fonts() -> list[Font]:
    return [bitmap_font()] + ([vector_font(s) for s in VARIED_VECTOR_SIZES] if has_freetype() else [])


def form_varied(rng: random.Random) -> Page:
    n = rng.randint(2, EASY_ROWS)
    labels = sorted(rng.sample(EASY_LABELS, n))
    values = [code(rng, *EASY_VALUE_LEN) for _ in labels]
    font = rng.choice(varied_form_fonts())
    pitch = line_height(font) + rng.randint(0, 4)
    x_label, y0 = rng.randint(1, 15), rng.randint(1, 11)  # any offset mod 8: glyphs straddle patches
    x_value = x_label + max(text_size(font, f"{lab}:")[0] for lab in labels) + rng.randint(3, 12)
    width = min(MAX_SIDE, x_value + max(text_size(font, v)[0] for v in values) + rng.randint(3, 12))
    height = min(MAX_SIDE, y0 + n * pitch + rng.randint(2, 8))
    canvas = Canvas(width, height)
    fields: dict[str, Any] = {}
    lines = []
    for row, (label, value) in enumerate(zip(labels, values)):
        y = y0 + row * pitch
        canvas.text((x_label, y), label + ":", font)
        canvas.text((x_value, y), value, font, path=label)
        fields[label] = value
        lines.append(f"{label}: {value}")
    image = finish(canvas, rng, noise=rng.uniform(0, VARIED_MAX_NOISE), max_degrees=VARIED_MAX_DEGREES)
    return image, fields, "\n".join(lines), canvas.boxes, canvas.glyphs


# ---------------------------------------------------------------------- form
_FIRST = ("Ada", "Bram", "Cleo", "Dario", "Elin", "Farah", "Goran", "Hana", "Ivo", "Juno", "Kai", "Lena")
_LAST = ("Aster", "Brook", "Crane", "Dale", "Frost", "Grove", "Hale", "Marsh", "Reed", "Stone", "Vale")


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2015, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


FORM_FIELDS = {  # label drawn -> (key in the JSON, value generator)
    "Name": ("name", lambda r: f"{r.choice(_FIRST)} {r.choice(_LAST)}"),
    "Date": ("date", _date),
    "Phone": ("phone", lambda r: "".join(r.choice(DIGITS) for _ in range(8))),
    "Amount": ("amount", lambda r: money(r, 1, 999)),
    "Invoice no": ("invoice_no", lambda r: code(r, 5, 7, DIGITS)),
    "Account": ("account", lambda r: code(r, 6, 8, ALNUM)),
    "City": ("city", lambda r: r.choice(PLACES)),
    "Item": ("item", lambda r: r.choice(NOUNS)),
    "Order": ("order", lambda r: "O-" + code(r, 4, 5, DIGITS)),
    "Code": ("code", lambda r: code(r, 3, 6, UPPER + DIGITS)),
    "Qty": ("qty", lambda r: str(r.randint(1, 99))),
    "Ref": ("ref", lambda r: code(r, 4, 6, ALNUM)),
}


def form(rng: random.Random) -> Page:
    font = rng.choice(varied_fonts())
    n = rng.randint(3, 7)
    labels = rng.sample(sorted(FORM_FIELDS), n)
    lh = line_height(font) + rng.randint(0, 4)
    width = rng.choice((192, 224, 256))
    height = min(256, 8 + lh * n + rng.randint(4, 24))
    canvas = Canvas(width, height)
    x_label = rng.randint(2, 12)
    y = rng.randint(2, max(2, height - lh * n - 2))
    x_value = x_label + max(text_size(font, f"{lab}:")[0] for lab in labels) + rng.randint(4, 16)
    sep = rng.choice((":", ":", " -"))
    fields: dict[str, Any] = {}
    lines = []
    for lab in labels:
        key, gen = FORM_FIELDS[lab]
        value = gen(rng)
        if not canvas.fits(x_value, y, value, font):  # a value too wide for this page: leave the row out
            continue
        canvas.text((x_label, y), lab + sep, font)
        canvas.text((x_value, y), value, font, path=key)
        fields[key] = value
        lines.append(f"{lab}{sep} {value}")
        y += lh
    image = finish(canvas, rng, noise=rng.uniform(0, 6))
    return image, fields, "\n".join(lines), canvas.boxes, canvas.glyphs
