"""The text-only control with a position signal: a page's text laid out as a character grid.

The plain text control (``inputs="text"``) gives a NoPE/KDA stack the content as a token stream with
no positions, while the image path gives every patch a learned row and column embedding
(``layers/vision.py``). ``inputs="text_grid"`` gives the text the same signal through the same
encoder: line ``r``, character ``c`` of ``Document.text`` becomes cell ``(r, c)`` of a ``Patches``
grid whose "pixels" are the one-hot code of that character (a linear patch projector on a one-hot
vector is a character embedding), so each character gets the row and column embeddings a glyph's
patch would. Cells past the end of a line are all zero (blank paper). No pixels are involved: it is
the text, with its own line/column layout as positions.

Limits: characters outside ``0 .. patch_dim - 2`` share the last code; lines and rows beyond the
encoder's ``max_grid`` (``max_image_side / patch_size``, 32 by default) are cut (form_easy and
form_varied lines are at most 10 characters; long receipt or figure lines are not).
"""

from __future__ import annotations

import torch

from longmoe.config import VisionConfig
from longmoe.types import Patches


def text_grid(text: str, cfg: VisionConfig) -> Patches:
    """``text``'s lines as a ``rows x cols`` grid of one-hot character cells ``[rows*cols, patch_dim]``."""
    g, dim = cfg.max_grid, cfg.patch_dim
    lines = [line[:g] for line in text.split("\n")][:g] or [""]
    rows, cols = len(lines), max(1, max(len(line) for line in lines))
    pixels = torch.zeros(rows * cols, dim)  # [n, patch_dim]
    for r, line in enumerate(lines):
        for c, ch in enumerate(line):
            pixels[r * cols + c, min(ord(ch), dim - 1)] = 1.0
    return Patches(pixels, rows, cols)
