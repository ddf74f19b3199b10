"""Argument checks shared by the KDA ops: each names the argument, the expected shape and what it got."""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype states and products are computed in: float64 for float64 inputs, else fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_tensor(name: str, x: object, shape: tuple[int, ...], expect: str, ref: torch.Tensor) -> None:
    """``x`` must be a tensor of ``shape`` on ``ref``'s device with ``ref``'s dtype."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor of shape {expect}, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name}: expected shape {expect} = {list(shape)}, got {list(x.shape)}")
    if x.device != ref.device:
        raise ValueError(f"{name}: expected device {ref.device} (same as q), got {x.device}")
    if x.dtype != ref.dtype:
        raise ValueError(f"{name}: expected dtype {ref.dtype} (same as q), got {x.dtype}")


def check_state(name: str, s: object, shape: tuple[int, ...], expect: str, ref: torch.Tensor) -> None:
    """A state: a floating-point tensor of ``shape`` on ``ref``'s device (any float dtype)."""
    if not isinstance(s, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor of shape {expect}, got {type(s).__name__}")
    if tuple(s.shape) != shape:
        raise ValueError(f"{name}: expected shape {expect} = {list(shape)}, got {list(s.shape)}")
    if s.device != ref.device:
        raise ValueError(f"{name}: expected device {ref.device} (same as q), got {s.device}")
    if not s.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point state, got {s.dtype}")


def check_inputs(q: object, k: object, v: object, g: object, beta: object) -> tuple[int, int, int, int, int]:
    """Validate sequence inputs; returns ``(B, T, H, K, V)``."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q: expected a tensor of shape [B, T, H, K], got {getattr(q, 'shape', type(q))}")
    if not q.is_floating_point():
        raise ValueError(f"q: expected a floating-point dtype, got {q.dtype}")
    B, T, H, K = q.shape
    if not isinstance(v, torch.Tensor) or v.dim() != 4:
        raise ValueError(f"v: expected a tensor of shape [B, T, H, V], got {getattr(v, 'shape', type(v))}")
    V = v.shape[-1]
    check_tensor("k", k, (B, T, H, K), "[B, T, H, K]", q)
    check_tensor("v", v, (B, T, H, V), "[B, T, H, V]", q)
    check_tensor("g", g, (B, T, H, K), "[B, T, H, K]", q)
    check_tensor("beta", beta, (B, T, H), "[B, T, H]", q)
    return B, T, H, K, V


def resolve_scale(scale: float | None, K: int) -> float:
    """The output scale: ``K^{-1/2}`` when ``None``."""
    if scale is None:
        return K**-0.5
    if not isinstance(scale, (int, float)) or isinstance(scale, bool):
        raise ValueError(f"scale: expected a float or None, got {type(scale).__name__}")
    return float(scale)
