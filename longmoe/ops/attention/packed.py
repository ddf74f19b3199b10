"""Causal softmax attention over documents packed in one row, without the ``[T, T]`` mask's cost.

Training packs many documents into one row of ``T`` tokens (``cu_seqlens``). The obvious way to keep
them apart is one ``[T, T]`` block-diagonal causal mask and a single attention call, but that computes
all ``T²`` scores although only ``Σ doc_len²/2`` are allowed: at 8 windows of 512 tokens per row it is
~8x the work (16x counting the causal half), and the attention of a pure-MLA tiny model was most of
its training step.

``packed_causal_attention`` does only the allowed work, two ways, picked by the mean document length:
- documents of ``min_doc_tokens`` or more on average: one causal ``scaled_dot_product_attention``
  per document (no mask at all, so the CPU flash kernel runs; cost ``Σ n²/2``), a loop whose
  per-call overhead (~1 ms fwd+bwd here) is small next to documents of that size;
- many tiny documents: the queries are cut into tiles of ``tile`` tokens. Documents are contiguous, so
  the keys a tile needs start at the first token of its first query's document and end at its last
  query; each tile is one masked attention over that span: ``T / tile`` calls whatever the number of
  documents, cost ``O(T · (tile + longest document))``.
On one core at T = 4096 (``bench/packed_attention.py``): 22 documents of 50-460 tokens, per-document
58 ms vs tiles 84 ms (full mask 695 ms); 193 documents of 4-40 tokens, per-document 173 ms vs tiles
78 ms. Both equal the masked full attention up to float rounding; ``ops/attention/naive.py``
(``packed_causal_attention_reference``) is that full version.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_TILE = 256
MIN_DOC_TOKENS = 64  # mean document length from which one call per document beats the tiles


def document_offsets(cu_seqlens: torch.Tensor, T: int) -> list[int]:
    """The offsets as Python ints, checked to run non-decreasing from 0 to ``T``."""
    bounds = [int(x) for x in cu_seqlens.tolist()] if cu_seqlens.dim() == 1 else []
    if not bounds or bounds[0] != 0 or bounds[-1] != T or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets [0, ..., T={T}], got {bounds[:8]}")
    return bounds


def document_ids(bounds: list[int], T: int, device: torch.device) -> torch.Tensor:
    """``[T]`` index of each token's document."""
    cu = torch.tensor(bounds, device=device)
    return torch.searchsorted(cu[1:], torch.arange(T, device=device), right=True)


def packed_causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
    tile: int = DEFAULT_TILE,
    min_doc_tokens: int = MIN_DOC_TOKENS,
) -> torch.Tensor:
    """``q [B, H, T, Dq]``, ``k [B, H, T, Dq]``, ``v [B, H, T, Dv]`` -> ``[B, H, T, Dv]``.

    Every row of the batch shares the packing ``cu_seqlens [N+1]`` (offsets of the documents along
    ``T``). Attention is causal inside a document and never crosses one.
    """
    T = q.shape[-2]
    if k.shape[-2] != T or v.shape[-2] != T:
        raise ValueError(
            f"q, k, v: expected the same length T, got {q.shape[-2]}, {k.shape[-2]}, {v.shape[-2]}"
        )
    if tile < 1:
        raise ValueError(f"tile={tile}: expected a positive integer")
    bounds = document_offsets(cu_seqlens, T)
    spans = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    if len(spans) * min_doc_tokens <= T:  # documents long enough: one mask-free causal call each
        outs = [
            F.scaled_dot_product_attention(
                q[..., a:b, :], k[..., a:b, :], v[..., a:b, :], is_causal=True, scale=scale
            )
            for a, b in spans
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
    doc_id = document_ids(bounds, T, q.device)
    outs = []
    for a in range(0, T, tile):
        b = min(a + tile, T)
        lo = bounds[int(doc_id[a])]  # documents are contiguous: no query of the tile sees a key before
        qi, ki = doc_id[a:b], doc_id[lo:b]
        pos_q = torch.arange(a, b, device=q.device)
        pos_k = torch.arange(lo, b, device=q.device)
        mask = (qi[:, None] == ki[None, :]) & (pos_k[None, :] <= pos_q[:, None])  # [b-a, b-lo]
        outs.append(
            F.scaled_dot_product_attention(
                q[..., a:b, :], k[..., lo:b, :], v[..., lo:b, :], attn_mask=mask, scale=scale
            )
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)
