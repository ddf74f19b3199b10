"""Sparse MoE ops (docs/design.md §1.5): routing (``route``), dropless expert dispatch (``dispatch``), the
static-shape per-pair gather for decode (``gather``) and the dense every-expert reference (``naive``)."""

from longmoe.ops.moe.dispatch import IMPLS, PAD_MULTIPLE, Layout, choose_tiers, dispatch_experts
from longmoe.ops.moe.gather import gather_experts
from longmoe.ops.moe.naive import dense_reference
from longmoe.ops.moe.route import (
    combine_weights,
    mask_to_top_groups,
    route,
    selected_logits,
    topk_lowest_index,
)

__all__ = [
    "IMPLS",
    "PAD_MULTIPLE",
    "Layout",
    "choose_tiers",
    "combine_weights",
    "dense_reference",
    "dispatch_experts",
    "gather_experts",
    "mask_to_top_groups",
    "route",
    "selected_logits",
    "topk_lowest_index",
]
