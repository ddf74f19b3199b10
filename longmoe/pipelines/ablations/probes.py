"""Cheap training-time probes of the KDA layers for the decay study.

Per training forward (one per optimizer step here) and over all KDA layers:

- ``min_gamma``: the most negative sum of 16 consecutive per-token log-decays of any channel, i.e. the
  most negative in-chunk cumulative log-decay ``Γ`` any chunk alignment could see. The all-GEMM chunk
  form multiplies by ``e^{−Γ}``, which overflows fp32 once ``Γ < −88`` (``ops.gates``);
- ``max_abs_o``: the largest ``|o|`` the KDA operator returned (inf/nan when it overflowed).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from longmoe.layers.kda import KDALayer
from longmoe.ops.gates import bounded_decay, kimi_decay, softplus_decay

FP32_EXP_LIMIT = -88.0  # e^{-Γ} overflows fp32 below this Γ


class DecayProbe:
    """Hooks on every ``KDALayer`` of ``model``; ``min_gamma`` / ``max_abs_o`` hold one value per training
    forward. ``close()`` removes the hooks."""

    def __init__(self, model: nn.Module, chunk: int = 16) -> None:
        self.chunk = chunk
        self.min_gamma: list[float] = []
        self.max_abs_o: list[float] = []
        self._gamma = math.inf
        self._o = 0.0
        self._layers = [m for m in model.modules() if isinstance(m, KDALayer)]
        self._hooks = []
        for layer in self._layers:
            self._hooks.append(layer.gate_up.register_forward_hook(self._gate_hook(layer)))
            self._hooks.append(layer.out_norm.register_forward_pre_hook(self._out_hook))
        if self._layers:  # the first KDA layer opens a forward's record, so flush on the next one
            self._hooks.append(self._layers[0].register_forward_pre_hook(self._start))

    def _start(self, module: nn.Module, args: tuple) -> None:
        if module.training:
            self.flush()

    def flush(self) -> None:
        """Close the current forward's record (called at the next forward and by ``close``)."""
        if self._gamma != math.inf:
            self.min_gamma.append(self._gamma)
            self.max_abs_o.append(self._o)
        self._gamma, self._o = math.inf, 0.0

    def _gate_hook(self, layer: KDALayer):
        @torch.no_grad()
        def hook(module: nn.Module, args: tuple, h: torch.Tensor) -> None:
            if not layer.training:
                return
            B, T, _ = h.shape
            h = h.float().view(B, T, layer.H, layer.K)
            A = layer.A.float()
            if layer.gate_kind == "bounded":
                g = bounded_decay(h, A, layer.g_min)
            else:
                g = kimi_decay(h, A) if layer.gate_kind == "kimi" else softplus_decay(h, A)
            c = window_sums(g.double(), self.chunk)  # [B, T', H, K] sums of `chunk` consecutive tokens
            self._gamma = min(self._gamma, float(c.min()))

        return hook

    @torch.no_grad()
    def _out_hook(self, module: nn.Module, args: tuple) -> None:
        if module.training:
            o = args[0]
            m = float(o.float().abs().max())
            self._o = m if not math.isfinite(m) else max(self._o, m)

    def close(self) -> None:
        self.flush()
        for h in self._hooks:
            h.remove()


def window_sums(g: torch.Tensor, n: int) -> torch.Tensor:
    """Sums of every ``n`` consecutive entries along dim 1 (all of them when shorter): ``[B, T, ...]``
    -> ``[B, max(1, T - n + 1), ...]``."""
    c = torch.cat([torch.zeros_like(g[:, :1]), g.cumsum(1)], 1)  # [B, T+1, ...]
    n = min(n, g.shape[1])
    return c[:, n:] - c[:, :-n]
