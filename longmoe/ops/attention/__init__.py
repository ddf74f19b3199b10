"""Softmax attention ops: causal attention over documents packed in one row (``packed``) and the masked
full-attention reference beside it (``naive``)."""

from longmoe.ops.attention.naive import packed_causal_attention_reference
from longmoe.ops.attention.packed import DEFAULT_TILE, MIN_DOC_TOKENS, packed_causal_attention

__all__ = ["DEFAULT_TILE", "MIN_DOC_TOKENS", "packed_causal_attention", "packed_causal_attention_reference"]
