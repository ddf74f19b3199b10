"""A request's images inside the engine: which prompt positions they fill, their embeddings sliced
per prefill chunk, and the pixel digests that key prefix reuse.

A prompt holding images carries their ``Patches`` in order; the ``k``-th ``<|image_patch|>`` token of
the prompt is the ``k``-th patch overall (``data.images.image_span`` lays each image out row-major).
The images are encoded once (``LongMoE.encode_images``), lazily at the first prefill chunk that
reaches a patch, and only from the first image not already in the restored cache (a prefix snapshot
or a session's kept row). Each chunked-prefill call gets the embeddings of exactly the patch tokens
it feeds, concatenated over the batch rows in order (the model fills ``<|image_patch|>`` positions
row-major). Decode never sees an image: on a model with a vision encoder the image tokens are banned
from sampling (``image_token_ids``), so a generated token can never ask for an embedding.

Prefix keys: two prompts with identical token ids can carry different images, so a block's hash
also covers the digest of every image whose first patch lies in the block (``marks``); the chained
hash then separates every later block too.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from longmoe.serve.errors import EngineError
from longmoe.serve.request import Mark

if TYPE_CHECKING:
    from longmoe.data.tokenizer import Tokenizer


def pixel_digest(p: Patches) -> bytes:
    """A digest of an image's patch grid and pixels (what the model sees, not the file's bytes)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{p.rows}x{p.cols}:".encode())
    h.update(p.pixels.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.digest()


@dataclass(eq=False)
class PromptImages:
    """The images of one prompt (see the module docstring)."""

    patches: list[Patches]
    positions: list[int]  # prompt position of every <|image_patch|> token, ascending
    marks: tuple[Mark, ...]
    _embeds: torch.Tensor | None = field(default=None, repr=False)  # [patches from _first on, d_model]
    _first: int = 0  # index (over all patches) of _embeds[0]

    @classmethod
    def of(cls, ids: Sequence[int], patches: Sequence[Patches], patch_id: int) -> PromptImages:
        """``EngineError`` unless ``ids`` holds exactly one ``<|image_patch|>`` per patch."""
        positions = [i for i, t in enumerate(ids) if t == patch_id]
        want = sum(p.n for p in patches)
        if len(positions) != want:
            raise EngineError(
                "images",
                f"the prompt holds {len(positions)} <|image_patch|> tokens but its {len(patches)} image(s) "
                f"have {want} patches (text must not spell image tokens; use data.images.image_span)",
            )
        marks, k = [], 0
        for p in patches:
            marks.append((positions[k], pixel_digest(p)))
            k += p.n
        return cls(list(patches), positions, tuple(marks))

    @property
    def total(self) -> int:
        return len(self.positions)

    def embeds(self, model: LongMoE, start: int, end: int) -> torch.Tensor | None:
        """Embeddings ``[n, d_model]`` of the patch tokens at prompt positions ``[start, end)``."""
        a, b = bisect.bisect_left(self.positions, start), bisect.bisect_left(self.positions, end)
        if a == b:
            return None
        if self._embeds is None or a < self._first:
            i, first = 0, 0  # encode from the image holding patch a on
            while first + self.patches[i].n <= a:
                first += self.patches[i].n
                i += 1
            self._embeds, self._first = model.encode_images(self.patches[i:]), first  # [Σ n, d]
        return self._embeds[a - self._first : b - self._first]

    def release(self) -> None:
        """Drop the embeddings (prefill is over; decode never needs them)."""
        self._embeds = None


def chunk_embeds(model: LongMoE, rows: Sequence[tuple[PromptImages | None, int, int]]) -> torch.Tensor | None:
    """The ``image_embeds`` of one prefill call: per batch row ``(images, start, end)`` of the prompt
    it feeds, the row's patch embeddings in order, rows concatenated; None when no row has a patch."""
    parts = [e for im, s, t in rows if im is not None and (e := im.embeds(model, s, t)) is not None]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else torch.cat(parts)  # [n, d_model]


def image_token_ids(model: LongMoE, tokenizer: Tokenizer) -> list[int]:
    """The ids decode must never produce on a model with a vision encoder (none for a text model)."""
    if model.cfg.vision is None:
        return []
    return [tokenizer.image_start_id, tokenizer.image_patch_id, tokenizer.image_end_id]


def check_images(
    model: LongMoE, ids: Sequence[int], patches: Sequence[Patches], patch_id: int
) -> PromptImages | None:
    """A submission's images as ``PromptImages`` (None without images), or ``EngineError``: images on
    a text-only model, or a prompt whose patch tokens do not match its images."""
    if model.cfg.vision is None:
        if patches:
            raise EngineError(
                "images",
                "this model reads text only (its config has no 'vision'); send the request without images",
            )
        return None
    if not patches:
        if patch_id in ids:
            raise EngineError("images", "the prompt holds <|image_patch|> tokens but no images were given")
        return None
    return PromptImages.of(ids, patches, patch_id)
