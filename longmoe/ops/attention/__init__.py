"""Softmax attention ops: causal attention over documents packed in one row (``packed``) and the masked
full-attention reference beside it (``naive``); a chunk's causal attention after a cached prefix
(``prefix``, with its reference); absorbed-MLA attention against shared latent rows after a cached
prefix, the prefix split over threads (``latent``, with its reference)."""

from longmoe.ops.attention.latent import latent_attention, latent_attention_reference
from longmoe.ops.attention.naive import packed_causal_attention_reference
from longmoe.ops.attention.packed import DEFAULT_TILE, MIN_DOC_TOKENS, packed_causal_attention
from longmoe.ops.attention.prefix import causal_after_prefix, causal_after_prefix_reference

__all__ = [
    "DEFAULT_TILE",
    "MIN_DOC_TOKENS",
    "causal_after_prefix",
    "causal_after_prefix_reference",
    "latent_attention",
    "latent_attention_reference",
    "packed_causal_attention",
    "packed_causal_attention_reference",
]
