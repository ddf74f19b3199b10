"""``parallelize(model, dims, mesh)``: the parallelisms applied as wrappers around an unchanged ``LongMoE``.

In order (the torchtitan recipe): context parallel, expert parallel, activation checkpointing, FSDP2.

- **FSDP2** (``fully_shard``): one group per sublayer, the token mixer (KDA/MLA) and the FFN of every
  block, whose ``forward`` the model calls from ``Block.mix`` / ``Block.feed``; then the root, which owns
  the embeddings, norms, AttnRes queries and LM head (gathered once per forward). Parameters become
  ``DTensor``s sharded on dim 0 over ``fsdp_mesh``; gradients are reduce-scattered (averaged over ranks).
- **Activation checkpointing** (optional) recomputes each mixer and dense FFN in the backward. It runs
  before FSDP so that FSDP groups the final module tree, with the composable ``checkpoint``, which adds
  no wrapper module (parameter names, and so checkpoints, are unchanged). MoE layers are not
  recomputed: their forward counts the balancer's load, and a recomputation would count it twice.
- **Context parallel** (``cp > 1``, ``context_parallel``): every KDA and MLA layer splits the sequence
  over the ``cp`` ranks; the model is then called with each rank's part and the global ``cu_seqlens``.
- **Expert parallel** (``ep > 1``, ``expert_parallel``): routed experts ``Shard(0)`` over ``ep``, tokens
  dispatched by all-to-all. FSDP2 then shards them again over ``expert_fsdp_mesh`` (dp_shard × cp): the
  MoE layer's group gives ``w_in``/``w_out`` their own mesh through ``shard_placement_fn`` (one shared
  ``FSDPMeshInfo``; torch keeps these names private in 2.13), every other parameter the full mesh.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import Shard

try:  # private in torch 2.13 and absent before it: only expert-parallel x FSDP2 needs them
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, ShardPlacementResult
except ImportError:  # pragma: no cover - older torch (e.g. a GPU image with torch 2.11)
    FSDPMeshInfo = ShardPlacementResult = None

from longmoe.distributed.context_parallel import ContextParallel, apply_context_parallel
from longmoe.distributed.expert_parallel import apply_expert_parallel
from longmoe.distributed.parallel_dims import ParallelDims, expert_fsdp_mesh, fsdp_mesh
from longmoe.layers.moe import MoELayer
from longmoe.model import LongMoE


def apply_activation_checkpointing(model: LongMoE) -> None:
    """Recompute every token mixer and dense FFN in the backward instead of keeping its activations."""
    for b in model.blocks:
        checkpoint(b.mixer)
        if not isinstance(b.ffn, MoELayer):
            checkpoint(b.ffn)


def apply_fsdp(model: LongMoE, mesh: DeviceMesh, expert_mesh: DeviceMesh | None = None) -> None:
    """FSDP2 over the 1-D ``mesh``: each mixer and FFN its own group, the rest in the root group.

    ``expert_mesh``: where expert-parallel routed experts (already ``Shard(0)`` over ``ep``) are sharded.
    """
    # FSDP2 warns when a group returns a view (MoELayer's reshape): an in-place op on it would skip the
    # backward hook. LongMoE only ever adds sublayer outputs out of place, so the warning is noise here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    if expert_mesh is not None and FSDPMeshInfo is None:
        raise RuntimeError(
            f"expert parallel with FSDP2 needs torch's per-parameter shard placement (torch>=2.13); "
            f"this is torch {torch.__version__}"
        )
    expert_info = None if expert_mesh is None else FSDPMeshInfo(expert_mesh, shard_mesh_dim=0)
    for b in model.blocks:
        fully_shard(b.mixer, mesh=mesh)
        experts = {id(b.ffn.w_in), id(b.ffn.w_out)} if isinstance(b.ffn, MoELayer) else set()
        place = None
        if expert_info is not None and experts:
            place = lambda p, ex=experts: ShardPlacementResult(Shard(0), expert_info) if id(p) in ex else None
        fully_shard(b.ffn, mesh=mesh, shard_placement_fn=place)
    # the root stays gathered through the forward (its parameters are used all along the network)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)


def parallelize(
    model: LongMoE, dims: ParallelDims, mesh: DeviceMesh, activation_checkpointing: bool = False
) -> ContextParallel | None:
    """Apply CP, EP, activation checkpointing and FSDP2 to ``model`` in place.

    ``mesh`` is ``dims.build_mesh(device)`` and ``model`` must already be on this rank's device (the
    same weights on every rank). Returns the model's ``ContextParallel`` when ``cp > 1``, else None.
    """
    cp = apply_context_parallel(model, mesh["cp"]) if dims.cp > 1 else None
    if dims.ep > 1:
        apply_expert_parallel(model, mesh["ep"])
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    apply_fsdp(model, fsdp_mesh(mesh), expert_fsdp_mesh(mesh) if dims.ep > 1 else None)
    return cp


def is_sharded(module: nn.Module) -> bool:
    """True once ``parallelize`` has applied FSDP2 to ``module``."""
    return isinstance(module, FSDPModule)
