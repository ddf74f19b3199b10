"""Dense gated MLP (SwiGLU / GeGLU): the FFN of dense layers and the shape of every expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ACTS = {"swiglu": F.silu, "geglu": F.gelu}


class GLUMLP(nn.Module):
    """``W_down (act(W_gate x) ⊙ W_up x)`` with the gate and up projections fused in one GEMM."""

    def __init__(self, d_model: int, hidden: int, glu: str = "swiglu") -> None:
        super().__init__()
        if glu not in _ACTS:
            raise ValueError(f"glu: expected one of {sorted(_ACTS)}, got {glu!r}")
        self.hidden = hidden
        self.act = _ACTS[glu]
        self.w_in = nn.Linear(d_model, 2 * hidden, bias=False)  # gate | up
        self.w_out = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w_in(x).split(self.hidden, dim=-1)  # [..., f] each
        return self.w_out(self.act(gate) * up)  # [..., d]

    @staticmethod
    def param_count(d_model: int, hidden: int) -> int:
        return 3 * d_model * hidden
