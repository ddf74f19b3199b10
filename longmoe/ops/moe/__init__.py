"""Sparse MoE ops (design.md §1.5): routing (``route``), dropless expert dispatch (``dispatch``) and the
dense every-expert reference beside it (``naive``)."""

from longmoe.ops.moe.dispatch import IMPLS, PAD_MULTIPLE, Layout, choose_tiers, dispatch_experts
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
    "mask_to_top_groups",
    "route",
    "selected_logits",
    "topk_lowest_index",
]
