"""Training rows of the vision_extract recipe: prompt (image span or text) + instruction -> JSON.

A row is ``eval.extract_local.prompt_ids`` (what evaluation asks) followed by the target JSON and
``<|eos|>``; labels are the next token on the JSON and ``<|eos|>`` only (IGNORE_INDEX on the prompt,
so on every image token too). Rows of a batch are right-padded (a causal model never reads the
padding of earlier positions). Batches are pure functions of ``(family mix, seed, step)``: training
seeds are ``step * batch_size + i`` on each family, all below ``HELD_OUT_SEED_BASE``.

The tokenizer is byte-level BPE with no merges (``char_tokenizer``): one token per character, so
copying a value from the page is one patch -> one token.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from longmoe.config import IGNORE_INDEX
from longmoe.data.tokenizer import MIN_VOCAB, Tokenizer
from longmoe.eval.extract.local import prompt_ids
from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from longmoe.tasks.documents import HELD_OUT_SEED_BASE, Document, render


def char_tokenizer() -> Tokenizer:
    """Specials + the 256 byte symbols, no merges: a character-level byte tokenizer."""
    return Tokenizer.train([], MIN_VOCAB)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], already shifted
    images: list[Patches]  # one per row for image inputs, none for text inputs
    n_target: int  # label tokens (JSON + eos) in the batch


def make_rows(
    docs: list[Document], tok: Tokenizer, model: LongMoE, inputs: str | list[str]
) -> tuple[list[list[int]], list[list[int]], list[Patches]]:
    """Rows, labels and the images (in row order) of ``docs``; ``inputs`` per document or for all."""
    kinds = [inputs] * len(docs) if isinstance(inputs, str) else inputs
    rows, labels, images = [], [], []
    for d, kind in zip(docs, kinds):
        prompt, patches = prompt_ids(d, tok, model, kind)
        target = [*tok.encode(d.target), tok.eos_id]
        ids = prompt + target
        lab = [IGNORE_INDEX] * (len(prompt) - 1) + target + [IGNORE_INDEX]  # lab[t] = ids[t + 1]
        rows.append(ids)
        labels.append(lab)
        if patches is not None:
            images.append(patches)
    return rows, labels, images


def collate(rows: list[list[int]], labels: list[list[int]], images: list[Patches], pad_id: int) -> Batch:
    T = max(len(r) for r in rows)
    x = torch.full((len(rows), T), pad_id, dtype=torch.long)
    y = torch.full((len(rows), T), IGNORE_INDEX, dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, labels)):
        x[i, : len(r)] = torch.tensor(r)
        y[i, : len(lab)] = torch.tensor(lab)
    return Batch(x, y, images, int((y != IGNORE_INDEX).sum()))


def family_for(mix: dict[str, float], rng: random.Random) -> str:
    names = sorted(mix)
    return rng.choices(names, weights=[mix[n] for n in names])[0]


def train_seed(seed: int, step: int, batch_size: int, row: int) -> int:
    """The render seed of a training row: unique per (seed, step, row) until it wraps, always below
    ``HELD_OUT_SEED_BASE`` (no held-out page is ever trained on)."""
    return (seed * 10_000_019 + step * batch_size + row) % HELD_OUT_SEED_BASE


def train_batch(
    mix: dict[str, float],
    step: int,
    batch_size: int,
    seed: int,
    tok: Tokenizer,
    model: LongMoE,
    inputs: str,
    text_rows: int = 0,
) -> Batch:
    """Batch ``step``: families drawn from ``mix``, render seeds unique per (seed, step, row); with
    ``inputs="image"`` the last ``text_rows`` rows show their document as text instead (co-training)."""
    rng = random.Random(f"vision-extract-batch:{seed}:{step}")
    docs = []
    for i in range(batch_size):
        docs.append(render(family_for(mix, rng), train_seed(seed, step, batch_size, i)))
    kinds = [inputs] * batch_size
    if inputs == "image" and text_rows:
        kinds[batch_size - text_rows :] = ["text"] * text_rows
    return collate(*make_rows(docs, tok, model, kinds), pad_id=tok.pad_id)
