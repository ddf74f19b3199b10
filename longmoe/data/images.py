"""Images → patches → tokens: decoding untrusted image bytes, the resize rule, the patch layout and
the token span an image occupies.

One image of ``rows × cols`` patches is the token span ``<|image|>`` + ``rows·cols ×
<|image_patch|>`` (row-major) + ``<|/image|>``; the model writes the vision encoder's patch
embeddings into the patch positions (``LongMoE.forward(image_embeds=)``). The image is first scaled
so its longer side is at most ``vision.max_image_side`` (aspect ratio kept, never enlarged), then
each side is rounded to the nearest multiple of ``patch_size`` (at least one patch), so
``image_tokens`` knows an image's cost from its size alone.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from PIL import Image

from longmoe.config import IGNORE_INDEX, VisionConfig
from longmoe.data.corpus import ImageRef
from longmoe.types import Patches

if TYPE_CHECKING:
    from longmoe.data.tokenizer import Tokenizer

MAX_PIXELS = 4096 * 4096  # default decode limit: larger images are refused before their pixels load
FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")  # what decode_image accepts


class ImageError(ValueError):
    """Bytes that are not a usable image: not an image, truncated, or too large to decode."""


def decode_image(data: bytes, *, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """An RGB image from untrusted ``data`` (PNG, JPEG, GIF (first frame), WEBP, BMP).

    The size is checked from the header before any pixel is decoded, so a decompression bomb (a tiny
    file claiming a huge canvas) costs nothing; transparent pixels are composited on white."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ImageError(f"image data: expected bytes, got {type(data).__name__}")
    if len(data) == 0:
        raise ImageError("image data is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(bytes(data)), formats=FORMATS)
            w, h = img.size
            if w * h > max_pixels:
                raise ImageError(
                    f"image is {w}×{h} = {w * h:,} pixels: more than the limit of {max_pixels:,}"
                )
            img.load()
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageError(f"image refused as a decompression bomb: {e}") from e
    except Image.UnidentifiedImageError as e:
        raise ImageError(f"data is not an image in a supported format ({', '.join(FORMATS)})") from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # truncated / corrupt streams
        raise ImageError(f"image data is truncated or corrupt: {e}") from e
    if img.mode in ("RGBA", "LA", "P", "PA") and ("A" in img.mode or "transparency" in img.info):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB")


def resized_size(height: int, width: int, cfg: VisionConfig) -> tuple[int, int]:
    """``(height, width)`` of an image after the resize rule (``VisionConfig.resized_size``)."""
    return cfg.resized_size(height, width)


def image_tokens(height: int, width: int, cfg: VisionConfig) -> int:
    """Tokens an image of ``height × width`` pixels takes in the stream, markers included (no decode)."""
    return cfg.image_tokens(height, width)


def resize(image: Image.Image, cfg: VisionConfig) -> Image.Image:
    """``image`` (RGB) resized by the resize rule (bicubic; unchanged when already that size)."""
    image = image.convert("RGB")
    h, w = resized_size(image.height, image.width, cfg)
    if (h, w) == (image.height, image.width):
        return image
    return image.resize((w, h), Image.Resampling.BICUBIC)


def to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB image as ``[3, H, W]`` float32 in [0, 1]."""
    a = np.asarray(image.convert("RGB"), dtype=np.uint8)  # [H, W, 3]
    return torch.from_numpy(a.copy()).permute(2, 0, 1).float() / 255.0


def patchify(image: Image.Image, cfg: VisionConfig) -> Patches:
    """Resize ``image`` and cut it into row-major ``P × P`` patches (layout: ``Patches``)."""
    x = to_tensor(resize(image, cfg))  # [3, H, W]
    p = cfg.patch_size
    rows, cols = x.shape[1] // p, x.shape[2] // p
    pixels = x.view(3, rows, p, cols, p).permute(1, 3, 0, 2, 4).reshape(rows * cols, 3 * p * p)
    return Patches(pixels.contiguous(), rows, cols)  # [rows*cols, 3*P*P]


def unpatchify(patches: Patches, patch_size: int) -> torch.Tensor:
    """The inverse of ``patchify``'s cut: ``[3, rows·P, cols·P]``."""
    p, r, c = patch_size, patches.rows, patches.cols
    if tuple(patches.pixels.shape) != (r * c, 3 * p * p):
        raise ValueError(
            f"patches: pixels have shape {list(patches.pixels.shape)}, expected [{r * c}, {3 * p * p}]"
        )
    return patches.pixels.view(r, c, 3, p, p).permute(2, 0, 3, 1, 4).reshape(3, r * p, c * p)


def image_span(patches: Patches, tokenizer: Tokenizer) -> list[int]:
    """The token ids of one image: ``<|image|>``, one ``<|image_patch|>`` per patch, ``<|/image|>``."""
    return [tokenizer.image_start_id] + [tokenizer.image_patch_id] * patches.n + [tokenizer.image_end_id]


def image_token_ids(tokenizer: Tokenizer) -> tuple[int, int, int]:
    """``(<|image|>, <|image_patch|>, <|/image|>)`` ids."""
    return tokenizer.image_start_id, tokenizer.image_patch_id, tokenizer.image_end_id


def mask_image_labels(labels: torch.Tensor | Sequence[int], tokenizer: Tokenizer) -> torch.Tensor | list[int]:
    """``labels`` (pre-shifted targets) with every image-token target set to ``IGNORE_INDEX``: the loss
    is on text only (a model cannot predict pixels from a token id). Same type as given (a copy)."""
    ids = image_token_ids(tokenizer)
    if isinstance(labels, torch.Tensor):
        out = labels.clone()
        out[torch.isin(out, torch.tensor(ids, device=out.device))] = IGNORE_INDEX
        return out
    return [IGNORE_INDEX if t in ids else t for t in labels]


# ---------------------------------------------------------------------- images of training documents
def read_image_ref(ref: ImageRef) -> bytes:
    """The bytes an interleaved document's image names: a ``data:<mime>;base64,`` URI, or a file (a
    relative path is resolved against ``ref.base``)."""
    uri = ref.uri
    if uri.startswith("data:"):
        head, sep, payload = uri.partition(",")
        if not sep or not head.endswith(";base64"):
            raise ImageError(f"data URI {uri[:40]!r}... is invalid: expected data:image/<type>;base64,<data>")
        if not head[5:].startswith("image/"):
            raise ImageError(f"data URI has MIME type {head[5:-7]!r}: expected image/<type>")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ImageError(f"data URI payload is not valid base64 ({e})") from e
    path = Path(ref.base) / uri
    if not path.is_file():
        raise ImageError(f"image file not found: {path}")
    return path.read_bytes()


class ImageLoader:
    """Turns a training document's ``ImageRef`` into ``Patches`` and its token span (the packer's view
    of the vision config and the tokenizer's image ids)."""

    def __init__(self, cfg: VisionConfig, tokenizer: Tokenizer, max_pixels: int = MAX_PIXELS) -> None:
        self.cfg, self.max_pixels = cfg, max_pixels
        self.start_id, self.patch_id, self.end_id = image_token_ids(tokenizer)
        self.pad_id = tokenizer.pad_id  # fills the rest of a window an image does not fit in
        self.ids = frozenset((self.start_id, self.patch_id, self.end_id))

    def load(self, ref: ImageRef) -> Patches:
        return patchify(decode_image(read_image_ref(ref), max_pixels=self.max_pixels), self.cfg)

    def span(self, patches: Patches) -> list[int]:
        return [self.start_id] + [self.patch_id] * patches.n + [self.end_id]
