"""Recall in long rows without ``[T, T]`` work: a model's logits at the answer positions only.

``answer_logits(model, ids, positions, chunk)`` equals ``model(ids).logits`` gathered at ``positions``
(tested at small lengths), computed as a chunked prefill:

- every block but the last runs chunk by chunk through a cache (KDA continues its state; MLA attends
  its cached latents, then the chunk's own, through the fused paths the engine's prefill takes), so
  activations stay ``O(chunk)`` beside the ``O(T · d_c)`` latents;
- a last MLA block only projects each chunk's latents, and attends from the ``n`` answer positions at
  the end (``MLALayer.attend_at``): ``O(n · T)`` where the full forward's last layer is ``O(T²)``. Its
  attention weights give the entropy at the answers (how spread the recall head is over the row).

The embedding (and a position control's conv, hooked on it) reads the whole row at once, so the conv
looks back across chunk borders as in one call. Plain residuals only (the MQAR models' setting).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from longmoe.config import IGNORE_INDEX
from longmoe.model import LongMoE
from longmoe.tasks.mqar import MQARBatch

DEFAULT_CHUNK = 8192


@dataclass(frozen=True)
class Readout:
    """``logits [B, n, V]`` at the asked positions; ``entropy [B, H, n]`` (nats) of the last layer's
    attention there, ``None`` when the last layer is KDA."""

    logits: torch.Tensor
    entropy: torch.Tensor | None


@torch.no_grad()
def answer_logits(
    model: LongMoE, ids: torch.Tensor, positions: torch.Tensor, chunk: int = DEFAULT_CHUNK
) -> Readout:
    """The logits at ``positions [B, n]`` of rows ``ids [B, T]`` (see the module docstring)."""
    if model.attn_res is not None:
        raise ValueError(
            "answer_logits: block attention residuals are not supported (attn_res must be false)"
        )
    if chunk < 1:
        raise ValueError(f"chunk={chunk}: expected a positive integer")
    B, T = ids.shape
    n = positions.shape[1]
    if positions.shape[0] != B or (n and not 0 <= int(positions.min()) <= int(positions.max()) < T):
        raise ValueError(f"positions: expected [{B}, n] inside [0, {T}), got {list(positions.shape)}")
    h_all = model.embed(ids)  # [B, T, d]: a forward hook on embed (the conv control) sees the whole row
    last = model.blocks[-1]
    attend_last = last.kind == "M"
    body = list(model.blocks)[:-1] if attend_last else list(model.blocks)
    cache = model.new_cache(B)
    d = h_all.shape[-1]
    at = h_all.new_zeros(B, n, d)  # the last block's input (or, KDA last, the final hidden) at positions
    rows = []  # the last MLA layer's cache rows, chunk by chunk
    for a in range(0, T, chunk):
        x = h_all[:, a : a + chunk]
        for i, blk in enumerate(body):
            x = x + blk.mix(x, cache, i, None)
            x = x + blk.feed(x)
        cache.advance(x.shape[1])
        if attend_last:
            rows.append(last.mixer.project(last.mixer_norm(x))[1])  # [B, t, d_c + d_r]
        inside = (positions >= a) & (positions < a + x.shape[1])  # [B, n]
        idx = (positions - a).clamp(0, x.shape[1] - 1)
        at = torch.where(inside[..., None], x.gather(1, idx[..., None].expand(B, n, d)), at)
    if not attend_last:
        return Readout(model.token_logits(at), None)
    y, w = last.mixer.attend_at(last.mixer_norm(at), torch.cat(rows, dim=1), positions)
    at = at + y
    at = at + last.feed(at)
    entropy = -(w * w.clamp_min(1e-30).log()).sum(-1)  # [B, H, n]; masked weights are 0 (0·log 0 = 0)
    return Readout(model.token_logits(at), entropy)


@dataclass(frozen=True)
class Recall:
    """Greedy answers right, answers asked, and the mean attention entropy at them (nats; ``None``
    without an MLA last layer)."""

    correct: int
    answers: int
    entropy: float | None


def recall(model: LongMoE, batch: MQARBatch, chunk: int = DEFAULT_CHUNK) -> Recall:
    """Score ``batch`` (every row asks the same number of answers) through ``answer_logits``."""
    asked = batch.labels != IGNORE_INDEX  # [B, T]
    per_row = asked.sum(1)
    if per_row.numel() and int(per_row.min()) != int(per_row.max()):
        raise ValueError("recall: every row must ask the same number of answers")
    B = batch.labels.shape[0]
    positions = asked.nonzero()[:, 1].view(B, -1)  # [B, n], ascending per row
    want = batch.labels.gather(1, positions)
    r = answer_logits(model, batch.input_ids, positions, chunk)
    ent = None if r.entropy is None else float(r.entropy.double().mean())
    return Recall(int((r.logits.argmax(-1) == want).sum()), int(want.numel()), ent)
