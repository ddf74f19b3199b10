"""Sparse MoE ops (docs/design.md §1.5): routing (``route``), dropless expert dispatch (``dispatch``),
the decode-sized loop over the chosen experts (``decode``), its one-token form for compiled CPU steps
(``reduce``), the static-shape per-pair gather (``gather``) and the dense every-expert reference
(``naive``)."""

from longmoe.ops.moe.decode import MAX_PAIRS as DECODE_MAX_PAIRS
from longmoe.ops.moe.decode import by_expert, decode_experts
from longmoe.ops.moe.dispatch import IMPLS, PAD_MULTIPLE, Layout, choose_tiers, dispatch_experts
from longmoe.ops.moe.gather import gather_experts
from longmoe.ops.moe.naive import dense_reference
from longmoe.ops.moe.reduce import gathered_reduction, one_token_compiled
from longmoe.ops.moe.route import (
    combine_weights,
    mask_to_top_groups,
    route,
    selected_logits,
    topk_lowest_index,
)

__all__ = [
    "DECODE_MAX_PAIRS",
    "IMPLS",
    "PAD_MULTIPLE",
    "Layout",
    "choose_tiers",
    "by_expert",
    "combine_weights",
    "decode_experts",
    "dense_reference",
    "dispatch_experts",
    "gather_experts",
    "gathered_reduction",
    "mask_to_top_groups",
    "one_token_compiled",
    "route",
    "selected_logits",
    "topk_lowest_index",
]
