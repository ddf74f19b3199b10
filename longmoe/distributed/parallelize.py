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
- **Expert / context parallel** come from their own modules (``expert_parallel``, ``context_parallel``);
  until those exist, ``ep > 1`` or ``cp > 1`` is refused with a message naming the missing piece.
"""

from __future__ import annotations

import warnings

from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from longmoe.config import ConfigError
from longmoe.distributed.parallel_dims import ParallelDims, fsdp_mesh
from longmoe.layers.moe import MoELayer
from longmoe.model import LongMoE


def apply_activation_checkpointing(model: LongMoE) -> None:
    """Recompute every token mixer and dense FFN in the backward instead of keeping its activations."""
    for b in model.blocks:
        checkpoint(b.mixer)
        if not isinstance(b.ffn, MoELayer):
            checkpoint(b.ffn)


def apply_fsdp(model: LongMoE, mesh: DeviceMesh) -> None:
    """FSDP2 over the 1-D ``mesh``: each mixer and FFN its own group, the rest in the root group."""
    # FSDP2 warns when a group returns a view (MoELayer's reshape): an in-place op on it would skip the
    # backward hook. LongMoE only ever adds sublayer outputs out of place, so the warning is noise here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    for b in model.blocks:
        fully_shard(b.mixer, mesh=mesh)
        fully_shard(b.ffn, mesh=mesh)
    # the root stays gathered through the forward (its parameters are used all along the network)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)


def parallelize(
    model: LongMoE, dims: ParallelDims, mesh: DeviceMesh, activation_checkpointing: bool = False
) -> LongMoE:
    """Apply CP, EP, activation checkpointing and FSDP2 to ``model`` in place; returns it.

    ``mesh`` is ``dims.build_mesh(device)`` and ``model`` must already be on this rank's device.
    """
    if dims.cp > 1:
        raise ConfigError(
            f"--cp {dims.cp}: context parallelism (longmoe.distributed.context_parallel) is not part of "
            "this build yet; run with --cp 1"
        )
    if dims.ep > 1:
        raise ConfigError(
            f"--ep {dims.ep}: expert parallelism (longmoe.distributed.expert_parallel) is not part of "
            "this build yet; run with --ep 1"
        )
    if activation_checkpointing:
        apply_activation_checkpointing(model)
    apply_fsdp(model, fsdp_mesh(mesh))
    return model


def is_sharded(module: nn.Module) -> bool:
    """True once ``parallelize`` has applied FSDP2 to ``module``."""
    return isinstance(module, FSDPModule)
