"""Plain data types shared across layers: below ``data`` and ``layers`` alike, importing only torch.

``Patches`` is made by ``data`` (``data/images.py`` cuts an image into them) and read by ``layers``
(``layers/vision.py`` embeds them); living here, neither of those packages imports the other.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Patches(NamedTuple):
    """One image as patches: ``pixels [rows*cols, 3*P*P]`` float32 in [0, 1], row-major over the grid;
    each patch is its ``[3, P, P]`` block flattened (channel, then y, then x)."""

    pixels: torch.Tensor
    rows: int
    cols: int

    @property
    def n(self) -> int:
        return self.rows * self.cols
