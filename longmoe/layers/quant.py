"""Modules holding weight-only quantized weights (``ops/quant.py``): what a quantized model is made of.

- ``QuantLinear`` replaces an ``nn.Linear``: the packed weight and its scales are buffers, the bias
  (if any) stays in the model dtype; ``forward`` is one packed-kernel call (+ bias).
- ``QuantExperts`` holds a ``MoELayer``'s routed experts packed per expert (``[E, ...]`` stacks in the
  kernels' ``out × in`` layout) and runs them with ``ops.quant.quantized_experts``.

Building them from float modules is ``from_linear`` / ``from_experts``; walking a whole model is
``longmoe/quantize.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from longmoe.ops.quant import (
    QuantizedWeight,
    check_mode,
    quantize_weight,
    quantized_experts,
    quantized_linear,
)


class QuantLinear(nn.Module):
    """``y = x Wᵀ + b`` with ``W`` int8 (per channel) or int4 (per group) packed; inference only."""

    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.mode, self.group_size = qw.mode, qw.group_size
        self.in_features, self.out_features = qw.in_features, qw.out_features
        self.register_buffer("qweight", qw.qweight)
        self.register_buffer("scales", qw.scales)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(
        cls, lin: nn.Linear, mode: str, group_size: int = 32, compute_dtype: torch.dtype = torch.bfloat16
    ) -> QuantLinear:
        check_mode(mode)
        return cls(quantize_weight(lin.weight, mode, group_size, compute_dtype), lin.bias)

    @property
    def packed(self) -> QuantizedWeight:
        return QuantizedWeight(
            self.mode, self.qweight, self.scales, self.out_features, self.in_features, self.group_size
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = quantized_linear(x, self.packed)  # [..., out]
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        g = f", group_size={self.group_size}" if self.mode == "int4" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}{g}"


class QuantExperts(nn.Module):
    """A MoE layer's routed GLU experts, packed per expert: ``forward(z [N, ℓ], idx, weights [N, k])``."""

    def __init__(self, w_in: QuantizedWeight, w_out: QuantizedWeight, glu: str) -> None:
        super().__init__()
        self.mode, self.glu = w_in.mode, glu
        self.shapes = (w_in.out_features, w_in.in_features, w_out.out_features, w_out.in_features)
        self.groups = (w_in.group_size, w_out.group_size)
        self.register_buffer("w_in_q", w_in.qweight)  # [E, 2f, ℓ] (int8) or packed int4
        self.register_buffer("w_in_s", w_in.scales)
        self.register_buffer("w_out_q", w_out.qweight)  # [E, ℓ, f] (int8) or packed int4
        self.register_buffer("w_out_s", w_out.scales)

    @classmethod
    def from_experts(
        cls,
        w_in: torch.Tensor,
        w_out: torch.Tensor,
        glu: str,
        mode: str,
        group_size: int = 32,
        compute_dtype: torch.dtype = torch.bfloat16,
    ) -> QuantExperts:
        """From the MoE's float stacks ``w_in [E, ℓ, 2f]`` and ``w_out [E, f, ℓ]`` (in × out)."""
        check_mode(mode)
        qi = quantize_weight(w_in.transpose(1, 2), mode, group_size, compute_dtype)  # [E, 2f, ℓ]
        qo = quantize_weight(w_out.transpose(1, 2), mode, group_size, compute_dtype)  # [E, ℓ, f]
        return cls(qi, qo, glu)

    def packed(self) -> tuple[QuantizedWeight, QuantizedWeight]:
        (n_i, k_i, n_o, k_o), (g_i, g_o) = self.shapes, self.groups
        return (
            QuantizedWeight(self.mode, self.w_in_q, self.w_in_s, n_i, k_i, g_i),
            QuantizedWeight(self.mode, self.w_out_q, self.w_out_s, n_o, k_o, g_o),
        )

    def forward(self, z: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        w_in, w_out = self.packed()
        return quantized_experts(z, idx, weights, w_in, w_out, self.glu)  # [N, ℓ]

    def extra_repr(self) -> str:
        return f"experts={self.w_in_q.shape[0]}, mode={self.mode}"
