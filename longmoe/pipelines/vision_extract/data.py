"""Training rows of the vision_extract recipe: prompt (image span or text) + instruction -> JSON.

A row is ``eval.extract_local.prompt_ids`` (what evaluation asks) followed by the target JSON and
``<|eos|>``; labels are the next token on the JSON and ``<|eos|>`` only (IGNORE_INDEX on the prompt,
so on every image token too). Rows of a batch are right-padded (a causal model never reads the
padding of earlier positions). Batches are pure functions of ``(family mix, seed, step)``: training
seeds are ``step * batch_size + i`` on each family, all below ``HELD_OUT_SEED_BASE``.

The tokenizer is byte-level BPE with no merges (``char_tokenizer``): one token per character, so
copying a value from the page is one patch -> one token.

Each image (or text grid) also carries its *reading targets* (``reading_targets``): what each patch
should read through the model's own output head, the characters whose centre lies in it (a
space for none). The recipe's patch-reading loss (``VisionExtractConfig.read_weight``) trains the
encoder to write a glyph's patch where the head reads that character, so that copying it to the answer
is one attention step; without it, lining the two up had to be found through the answer loss alone,
which at this model size happened at some seeds and not at others (docs/vision.md).
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

SPACE = " "  # what a patch with no glyph centre reads


def char_tokenizer() -> Tokenizer:
    """Specials + the 256 byte symbols, no merges: a character-level byte tokenizer."""
    return Tokenizer.train([], MIN_VOCAB)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T]
    labels: torch.Tensor  # [B, T], already shifted
    images: list[Patches]  # one per row for image inputs, none for text inputs
    n_target: int  # label tokens (JSON + eos) in the batch
    reads: torch.Tensor | None = None  # [Σ patches, vocab] reading targets of ``images`` (rows sum to 1)


def reading_targets(doc: Document, patches: Patches, kind: str, patch_size: int, tok: Tokenizer,
                    vocab: int) -> torch.Tensor:  # fmt: skip
    """``[rows·cols, vocab]``: the characters each patch of ``doc``'s image holds the centre of
    (``Document.glyphs``, scaled as ``patchify`` resized the page), equally weighted, or a space; for a
    ``text_grid`` (``eval.extract.textgrid``) the character of each cell."""
    cells: dict[int, list[int]] = {}
    if kind == "text_grid":
        for r, line in enumerate(doc.text.split("\n")[: patches.rows]):
            for c, ch in enumerate(line[: patches.cols]):
                cells[r * patches.cols + c] = [ch]
    else:
        w, h = doc.image.size
        sx, sy = patches.cols * patch_size / w, patches.rows * patch_size / h
        for g in doc.glyphs:
            r, c = int(g.y * sy // patch_size), int(g.x * sx // patch_size)
            if 0 <= r < patches.rows and 0 <= c < patches.cols:
                cells.setdefault(r * patches.cols + c, []).append(g.char)
    t = torch.zeros(patches.n, vocab)
    t[:, tok.encode(SPACE)[0]] = 1.0
    for k, chars in cells.items():
        ids = [i for ch in chars for i in tok.encode(ch)]  # one id per character (char_tokenizer, ASCII)
        t[k] = 0.0
        t[k].index_add_(0, torch.tensor(ids), torch.full((len(ids),), 1.0 / len(ids)))
    return t


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
    b = collate(*make_rows(docs, tok, model, kinds), pad_id=tok.pad_id)
    if b.images:
        shown = [(d, k) for d, k in zip(docs, kinds) if k != "text"]  # the rows with an image, in order
        P, V = model.cfg.vision.patch_size, model.cfg.vocab_size
        b.reads = torch.cat([reading_targets(d, p, k, P, tok, V) for (d, k), p in zip(shown, b.images)])
    return b
