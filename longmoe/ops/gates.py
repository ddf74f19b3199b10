"""Per-channel log-decay gates for KDA.

``bounded_decay`` is the seeds' stability trick: ``g = g_min * sigmoid(exp(A) * h)`` keeps every
log-decay in ``(g_min, 0)``, so within a chunk of ``C`` tokens the cumulative decay ``Γ`` stays in
``[C * g_min, 0]`` and ``exp(±Γ)`` is finite in fp32/bf16 (for ``C = 16, g_min = -5``: ``|Γ| <= 80 < 88.7``).
``softplus_decay`` is the unbounded baseline ``-exp(A) * softplus(h)`` kept to show why that matters.
``kimi_decay`` is Kimi-Linear's gate ``-exp(A_log) * softplus(f + dt_bias)`` with one ``A_log`` per head:
unbounded too, so a layer using it runs the log-space chunk path (``ops.kda.kda_chunk(..., intra=
"logspace")``), which never forms ``exp(-Γ)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DEFAULT_G_MIN = -5.0
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above this (Kimi-Linear's and torch's cut-over)


def _check_gate_args(h: torch.Tensor, A: torch.Tensor) -> None:
    if not isinstance(h, torch.Tensor) or not h.is_floating_point():
        raise ValueError(
            f"h: expected a floating-point tensor [..., H, K], got {getattr(h, 'dtype', type(h))}"
        )
    if not isinstance(A, torch.Tensor) or not A.is_floating_point():
        raise ValueError(
            f"A: expected a floating-point tensor [H, K] or [H, 1], got {getattr(A, 'dtype', type(A))}"
        )
    if h.dim() < 2:
        raise ValueError(f"h: expected shape [..., H, K] (at least 2 dims), got {tuple(h.shape)}")
    if A.dim() > 2:
        raise ValueError(f"A: expected shape [H, K] or [H, 1] (at most 2 dims), got {tuple(A.shape)}")
    trailing = tuple(h.shape[-2:])
    # broadcastable to [H, K] without growing it (plain ints: torch.broadcast_shapes costs a decode
    # step's worth of symbolic-shape checks per call)
    if not all(a in (1, t) for a, t in zip(reversed(A.shape), reversed(trailing), strict=False)):
        raise ValueError(
            f"A: expected a shape broadcastable to h's trailing [H, K] = {list(trailing)}, "
            f"got {tuple(A.shape)}"
        )
    if A.device != h.device:
        raise ValueError(f"A: expected device {h.device} (same as h), got {A.device}")
    if A.dtype != h.dtype:
        raise ValueError(f"A: expected dtype {h.dtype} (same as h), got {A.dtype}")


def bounded_decay(h: torch.Tensor, A: torch.Tensor, g_min: float = DEFAULT_G_MIN) -> torch.Tensor:
    """Bounded log-decay ``g_min * sigmoid(exp(A) * h)`` in ``(g_min, 0)``; same shape as ``h``.

    ``h``: ``[..., H, K]`` gate pre-activations; ``A``: learned log-scale, broadcastable to ``[H, K]``.
    """
    if not isinstance(g_min, (int, float)) or not g_min < 0:
        raise ValueError(f"g_min: expected a negative float (the most negative log-decay), got {g_min!r}")
    _check_gate_args(h, A)
    return g_min * torch.sigmoid(A.exp() * h)  # [..., H, K]


def softplus_decay(h: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Unbounded baseline log-decay ``-exp(A) * softplus(h)`` in ``(-inf, 0)``; same shape as ``h``."""
    _check_gate_args(h, A)
    return -A.exp() * F.softplus(h)  # [..., H, K]


def kimi_decay(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None = None) -> torch.Tensor:
    """Kimi-Linear's log-decay ``-exp(A_log) * softplus(f + dt_bias)`` in ``(-inf, 0)``; shape of ``f``.

    ``f``: ``[..., H, K]`` gate pre-activations (already including ``dt_bias`` when it is None);
    ``A_log``: ``[H, 1]`` (one decay rate per head, as Kimi-Linear stores it) or ``[H, K]``;
    ``dt_bias``: ``[H, K]`` or None. Computed in fp32 (float64 for float64 inputs): these are log-decays
    that the chunk path sums over a chunk.
    """
    _check_gate_args(f, A_log)
    cdt = torch.float64 if f.dtype == torch.float64 else torch.float32
    x = f.to(cdt)
    if dt_bias is not None:
        if tuple(dt_bias.shape) != tuple(f.shape[-2:]):
            raise ValueError(
                f"dt_bias: expected shape {list(f.shape[-2:])} (f's [H, K]), got {list(dt_bias.shape)}"
            )
        x = x + dt_bias.to(cdt)
    return -A_log.to(cdt).exp() * F.softplus(x, threshold=SOFTPLUS_THRESHOLD)  # [..., H, K]
