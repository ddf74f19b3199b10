"""Drawing helpers shared by the document families: Pillow's built-in fonts, text boxes, noise, rotation.

Only fonts that ship inside Pillow are used (nothing is downloaded): the bitmap font of
``ImageFont.load_default_imagefont()`` (6x11 px cells, always present) and, where Pillow has FreeType,
the vector font of ``ImageFont.load_default(size=...)`` at a few sizes. Every ground-truth value drawn
is recorded as a ``Box`` (canvas coordinates before any rotation) so that tests can check that it
really is on the page, and every character drawn as a ``Glyph`` (its ink centre on the finished page,
rotation included): where a reader has to look for it, the target of the vision recipe's patch-reading
loss.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont, features

Font = ImageFont.ImageFont | ImageFont.FreeTypeFont
WHITE = (255, 255, 255)
INK = (0, 0, 0)
MAX_SIDE = 256  # every family's images fit in 256 x 256 (VisionConfig.max_image_side's default)

UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DIGITS = "0123456789"
ALNUM = UPPER + DIGITS


@dataclass(frozen=True)
class Box:
    """Where one ground-truth value was drawn: its JSON path and pixel box (x0, y0, x1, y1)."""

    path: str
    text: str
    box: tuple[int, int, int, int]


@dataclass(frozen=True)
class Glyph:
    """One drawn character and the centre (x, y) of its box in page pixels, after any rotation."""

    char: str
    x: float
    y: float


Page = tuple[Image.Image, dict[str, Any], str, list[Box], list[Glyph]]  # a family's render: image,
# ground-truth fields, the content as text, the values' boxes, the characters' centres


@functools.lru_cache(maxsize=1)
def bitmap_font() -> Font:
    """Pillow's built-in bitmap font: every glyph a 6x11 cell, ink in rows 2..8, binary pixels."""
    return ImageFont.load_default_imagefont()


def has_freetype() -> bool:
    return bool(features.check("freetype2"))


@functools.cache
def vector_font(size: int) -> Font:
    """Pillow's built-in vector font (Aileron) at ``size`` px; the bitmap font without FreeType."""
    return ImageFont.load_default(size=size) if has_freetype() else bitmap_font()


def varied_fonts() -> list[Font]:
    """The fonts the harder families draw from: the bitmap font plus vector sizes 10..13 when present."""
    out: list[Font] = [bitmap_font()]
    if has_freetype():
        out += [vector_font(s) for s in (10, 11, 12, 13)]
    return out


def text_size(font: Font, text: str) -> tuple[int, int]:
    """Width and height in pixels of ``text`` drawn at (0, 0) (the ink box's right/bottom edge)."""
    x0, y0, x1, y1 = font.getbbox(text)
    return int(x1), int(y1)


def line_height(font: Font) -> int:
    return text_size(font, "Ag")[1] + 3


class Canvas:
    """A white RGB page that records the box of each ground-truth value and the centre of each
    character it draws."""

    def __init__(self, width: int, height: int) -> None:
        if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
            raise ValueError(f"canvas {width}x{height} is invalid: expected sides in 1..{MAX_SIDE}")
        self.image = Image.new("RGB", (width, height), WHITE)
        self.draw = ImageDraw.Draw(self.image)
        self.boxes: list[Box] = []
        self.glyphs: list[Glyph] = []

    @property
    def width(self) -> int:
        return self.image.width

    @property
    def height(self) -> int:
        return self.image.height

    def text(self, xy: tuple[int, int], text: str, font: Font, path: str | None = None) -> tuple[int, int]:
        """Draw ``text`` with its top-left at ``xy``; record it under ``path``; return its (right, bottom)."""
        x, y = xy
        self.draw.text((x, y), text, font=font, fill=INK)
        for i, ch in enumerate(text):
            if not ch.isspace():  # its box, moved right by the advance of the text before it
                x0, y0, x1, y1 = font.getbbox(ch)
                self.glyphs.append(Glyph(ch, x + font.getlength(text[:i]) + (x0 + x1) / 2, y + (y0 + y1) / 2))
        w, h = text_size(font, text)
        if path is not None:
            self.boxes.append(Box(path, text, (x, y, x + w, y + h)))
        return x + w, y + h

    def fits(self, x: int, y: int, text: str, font: Font, margin: int = 2) -> bool:
        w, h = text_size(font, text)
        return x >= 0 and y >= 0 and x + w <= self.width - margin and y + h <= self.height - margin


ROTATION_KEY = "longmoe_rotation_deg"  # ``Image.info`` key of the angle ``finish`` turned the page by


def rotate_point(x: float, y: float, degrees: float, width: int, height: int) -> tuple[float, float]:
    """Where pixel (x, y) lands when a ``width × height`` page is turned ``degrees`` anticlockwise
    about its centre (``Image.rotate``'s rule; y points down)."""
    t, cx, cy = math.radians(degrees), width / 2, height / 2
    dx, dy = x - cx, y - cy
    return cx + dx * math.cos(t) + dy * math.sin(t), cy - dx * math.sin(t) + dy * math.cos(t)


def finish(canvas: Canvas, rng: random.Random, noise: float = 0.0, max_degrees: float = 0.0) -> Image.Image:
    """The canvas's page turned by a small rotation (uniform in ±``max_degrees``, white fill, same size;
    its glyph centres turned with it) then Gaussian pixel noise of standard deviation ``noise`` (in
    0..255 units), both drawn from ``rng``: deterministic."""
    image, angle = canvas.image, 0.0
    if max_degrees > 0:
        angle = rng.uniform(-max_degrees, max_degrees)
        image = image.rotate(angle, resample=Image.Resampling.BILINEAR, fillcolor=WHITE)
        canvas.glyphs = [Glyph(g.char, *rotate_point(g.x, g.y, angle, image.width, image.height))
                         for g in canvas.glyphs]  # fmt: skip
    if noise > 0:
        g = np.random.default_rng(rng.getrandbits(63))
        a = np.asarray(image, dtype=np.float32) + g.normal(0.0, noise, size=(image.height, image.width, 1))
        image = Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), "RGB")
    image.info[ROTATION_KEY] = angle  # Document.rotation: what the error analysis reads
    return image


def code(rng: random.Random, lo: int, hi: int, alphabet: str = ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))


def money(rng: random.Random, lo: float, hi: float) -> str:
    """A price as text with two decimals (strings, so that scoring never meets float rounding)."""
    cents = rng.randint(int(lo * 100), int(hi * 100))
    return f"{cents // 100}.{cents % 100:02d}"


def wrap(text: str, font: Font, width: int) -> list[str]:
    """Greedy word wrap of ``text`` into lines at most ``width`` px wide."""
    lines: list[str] = []
    cur = ""
    for w in text.split():
        cand = f"{cur} {w}" if cur else w
        if cur and text_size(font, cand)[0] > width:
            lines.append(cur)
            cur = w
        else:
            cur = cand
    if cur:
        lines.append(cur)
    return lines
