"""Dense gated MLP (SwiGLU / GeGLU): the FFN of dense layers and the MoE's shared experts.

The activation is ``ops/glu.py``'s, the same function the routed experts compute.
"""

from __future__ import annotations

import torch
from torch import nn

from longmoe.ops.glu import check_glu, glu_act


class GLUMLP(nn.Module):
    """``W_down (act(W_gate x) ⊙ W_up x)`` with the gate and up projections fused in one GEMM."""

    def __init__(self, d_model: int, hidden: int, glu: str = "swiglu") -> None:
        super().__init__()
        check_glu(glu)
        self.hidden, self.glu = hidden, glu
        self.w_in = nn.Linear(d_model, 2 * hidden, bias=False)  # gate | up
        self.w_out = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(glu_act(self.w_in(x), self.glu))  # [..., 2f] -> [..., f] -> [..., d]

    @staticmethod
    def param_count(d_model: int, hidden: int) -> int:
        return 3 * d_model * hidden
