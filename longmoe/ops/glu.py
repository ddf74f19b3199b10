"""The gated linear unit of every feed-forward: ``act(gate) ⊙ up`` on a fused ``gate|up`` tensor.

One implementation for the dense MLP (``layers/mlp.py``), the shared experts and the routed experts
(``ops/moe``), so one ``glu`` setting computes the same function in dense and MoE layers:

- ``swiglu``: ``act = SiLU``;
- ``geglu``: ``act = GELU`` in its exact erf form, ``x·Φ(x)`` (``F.gelu``'s default and what
  transformers calls ``"gelu"``), not the tanh approximation.

``glu_act`` is the forward; ``glu_act_backward`` is its gradient for the routed experts' hand-written
backward (``ops/moe/dispatch.py``), which keeps only the fused pre-activation ``h``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GLUS = ("swiglu", "geglu")


def check_glu(glu: str) -> None:
    """Raise ``ValueError`` naming the choices unless ``glu`` is one of ``GLUS``."""
    if glu not in GLUS:
        raise ValueError(f"glu: expected one of {sorted(GLUS)}, got {glu!r}")


def _act(g: torch.Tensor, glu: str) -> torch.Tensor:
    return F.silu(g) if glu == "swiglu" else F.gelu(g)


def glu_act(h: torch.Tensor, glu: str) -> torch.Tensor:
    """``act(gate) * up`` for a fused ``h [..., 2f]`` = gate|up -> ``[..., f]``."""
    check_glu(glu)
    g, u = h.chunk(2, dim=-1)
    return _act(g, glu) * u


def glu_act_backward(h: torch.Tensor, da: torch.Tensor, glu: str) -> torch.Tensor:
    """Gradient of ``glu_act`` w.r.t. the fused input ``h [..., 2f]`` given ``da [..., f]``, the
    gradient of its output: ``[act'(gate)·up·da | act(gate)·da]``."""
    check_glu(glu)
    g, u = h.chunk(2, dim=-1)
    if glu == "swiglu":
        dg = torch.ops.aten.silu_backward(da * u, g)
    else:
        dg = torch.ops.aten.gelu_backward(da * u, g)  # approximate="none": the exact form
    return torch.cat([dg, da * _act(g, glu)], dim=-1)
