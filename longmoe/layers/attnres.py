"""Block attention residuals: each sublayer reads a learned softmax mixture of block summaries.

Layers are grouped into ``N`` blocks. Inside a block the sublayer outputs are summed (the ordinary
residual) into a partial block representation; finished blocks are frozen as ``b_1 … b_{n-1}`` and the
embedding is ``b_0``. A sublayer's input is ``Σ_i softmax_i(w_lᵀ RMSNorm(v_i)) v_i`` over
``[b_0, …, b_{n-1}, partial]`` with one pseudo-query ``w_l ∈ R^d`` per sublayer (and one for the final
norm). ``w_l`` starts at zero, so at init every input is the uniform average of its sources. Extra
memory: ``N`` vectors per token, not one per layer. Everything is per token, so decode needs no cache.
"""

from __future__ import annotations

import torch
from torch import nn

from longmoe.layers.norm import rms_norm


def block_of_layers(n_layers: int, n_blocks: int) -> list[int]:
    """Block index of each layer: ``n_blocks`` contiguous groups of (nearly) equal size."""
    return [layer * n_blocks // n_layers for layer in range(n_layers)]


class BlockAttnRes(nn.Module):
    """Pseudo-queries ``[n_queries, d]`` (zero-init) and the mixing rule; the model keeps the sources."""

    def __init__(self, n_queries: int, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.queries = nn.Parameter(torch.zeros(n_queries, d_model))

    @staticmethod
    def param_count(n_queries: int, d_model: int) -> int:
        return n_queries * d_model

    def keys(self, v: torch.Tensor) -> torch.Tensor:
        """The key of a source: its RMS-normalised value (no weight)."""
        return rms_norm(v, self.eps)

    def forward(self, idx: int, values: list[torch.Tensor], keys: list[torch.Tensor]) -> torch.Tensor:
        """Mix sources ``values[i] [B, T, d]`` with query ``idx``; ``keys[i] = self.keys(values[i])``."""
        if len(values) == 1:
            return values[0]
        w = self.queries[idx].to(values[0].dtype)  # [d]
        # without autograd the sources are stacked: a handful of kernels whatever their number (a decode
        # step mixes 17 times); with it, per source (a stack would hold a copy of every source for backward)
        stacked = not torch.is_grad_enabled()
        logits = torch.stack(keys) @ w if stacked else torch.stack([k @ w for k in keys])  # [S, B, T]
        p = torch.softmax(logits.float(), dim=0).to(values[0].dtype)  # [S, B, T]
        if stacked:
            return (torch.stack(values) * p.unsqueeze(-1)).sum(0)
        out = values[0] * p[0, ..., None]
        for i in range(1, len(values)):
            out = out + values[i] * p[i, ..., None]
        return out  # [B, T, d]
