"""The packed-attention reference: one attention call with the full ``[T, T]`` block-diagonal causal mask.

``O(T²)`` whatever the documents; obviously correct, the oracle ``packed_causal_attention``
(``ops/attention/packed.py``) is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longmoe.ops.attention.packed import document_ids, document_offsets


def packed_causal_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """The obviously-correct version: one attention call with the full ``[T, T]`` block-diagonal mask."""
    T = q.shape[-2]
    doc_id = document_ids(document_offsets(cu_seqlens, T), T, q.device)
    mask = torch.tril(doc_id[:, None] == doc_id[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
