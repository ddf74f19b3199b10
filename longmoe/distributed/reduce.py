"""Cross-rank reductions the trainer needs so a sharded step equals the one-process step.

- ``clip_grad_norm_``: the global gradient norm over ``DTensor`` (sharded) and plain gradients, grouped
  by mesh so that expert-parallel parameters (another mesh) and FSDP parameters combine correctly.
- ``all_reduce_sum``: sums of Python floats (losses weighted by tokens, token counts) over all ranks.
- ``sync_balance_stats``: each MoE layer's per-step expert counts and router-entropy sums, summed over
  all ranks before ``update_balance``, so every rank moves the same bias as the one-process run would.

All are no-ops (plain local computations) without a process group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from longmoe.distributed.parallel_dims import is_distributed


def grad_norm(parameters: Iterable[nn.Parameter], norm_type: float = 2.0) -> torch.Tensor:
    """The norm of all gradients as one vector (across ranks for sharded ones); a 0-dim fp32 tensor."""
    groups: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            g = p.grad
            key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else None
            groups.setdefault(key, []).append(g)
    norms = []
    for grads in groups.values():
        n = torch.nn.utils.get_total_norm(grads, norm_type)
        norms.append((n.full_tensor() if isinstance(n, DTensor) else n).float().cpu())
    if not norms:
        return torch.zeros(())
    stacked = torch.stack(norms)
    if math.isinf(norm_type):
        return stacked.max()
    return stacked.pow(norm_type).sum().pow(1.0 / norm_type)


def clip_grad_norm_(parameters: Iterable[nn.Parameter], max_norm: float, norm_type: float = 2.0) -> float:
    """Scale gradients so their global norm is at most ``max_norm``; returns the norm before clipping.

    Same rule as ``torch.nn.utils.clip_grad_norm_`` (coefficient ``max_norm / (norm + 1e-6)``, capped at
    1); a non-finite norm is returned as is and the gradients are left alone (the caller skips the step).
    """
    params = [p for p in parameters if p.grad is not None]
    total = float(grad_norm(params, norm_type))
    if not math.isfinite(total):
        return total
    coef = torch.tensor(max_norm, dtype=torch.float32) / (torch.tensor(total, dtype=torch.float32) + 1e-6)
    if float(coef) < 1.0:
        for p in params:
            p.grad.mul_(float(coef))
    return total


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64; identity without a process group)."""
    if not is_distributed():
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def comm_device() -> torch.device:
    """Where tensors for the default group's collectives live: this rank's GPU for NCCL, else CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@torch.no_grad()
def sync_balance_stats(moe_layers: list[nn.Module]) -> None:
    """Sum every MoE layer's ``step_counts`` and ``step_entropy`` over all ranks, in one all-reduce."""
    if not is_distributed() or not moe_layers:
        return
    bufs = [b for m in moe_layers for b in (m.step_counts, m.step_entropy)]
    flat = torch.cat([b.reshape(-1).double() for b in bufs])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    for b, piece in zip(bufs, flat.split([b.numel() for b in bufs])):
        b.copy_(piece.view_as(b))
