"""RMSNorm and the gated RMSNorm used on KDA outputs.

No mean subtraction and no bias: RMSNorm keeps the residual stream's direction and only fixes its
scale, which is all pre-norm blocks need. ``rms_norm`` (no weight) is also the key normaliser of
block attention residuals.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Parameter-free RMS normalisation over the last dim (same shape and dtype as ``x``)."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dim; weight initialised to ones."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

    @staticmethod
    def param_count(dim: int) -> int:
        return dim


class GatedRMSNorm(nn.Module):
    """``RMSNorm(o) ⊙ sigmoid(gate)`` per head: the KDA output gate (weight shared across heads)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        # o, gate: [..., H, V]
        return F.rms_norm(o, (o.shape[-1],), self.weight, self.eps) * torch.sigmoid(gate)

    @staticmethod
    def param_count(dim: int) -> int:
        return dim
