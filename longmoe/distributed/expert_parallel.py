"""Expert parallelism (docs/design.md §1.5, §5): the routed experts of every MoE layer sharded over ranks.

``apply_expert_parallel(model, ep_mesh)`` turns each ``MoELayer``'s ``w_in [E, ℓ, 2f]`` and
``w_out [E, f, ℓ]`` into ``DTensor`` parameters ``Shard(0)`` on the expert-parallel mesh (rank ``r`` keeps
experts ``[r·E/P, (r+1)·E/P)``; state-dict keys unchanged, so DCP saves and reshards them) and installs
``ExpertParallelDispatch`` in the layer's ``expert_dispatch`` seam. Routing, the latent projections and
the shared experts stay local; per layer and forward the routed part becomes:

1. the ``N·k`` (token, slot) pairs sorted by expert, hence by destination rank ``e // (E/P)``;
2. **count exchange**: ``all_to_all_single`` of the per-(rank, local expert) pair counts (``E`` ints);
3. **dispatch**: one variable-size ``all_to_all_single`` of the latent rows ``z`` (``ℓ = d/α`` numbers
   per pair, not ``d``: the communication saving of the latent expert space);
4. the local experts run on the rows received with the grouped dispatch op (``ops.moe.dispatch_experts``,
   ``k = 1``, weight 1); the expert of each row is known from the exchanged counts, no ids travel;
5. **combine**: the reverse ``all_to_all_single`` returns each pair's expert output to its token's rank,
   which weights and sums its ``k`` pairs (the combine weights never travel; their gradient stays local).

Both all-to-alls are PyTorch's autograd-aware functional collectives: their backward is the reverse
all-to-all, so an expert's weight gradient on its owner gathers the contributions of every rank's
tokens. That gradient is scaled by ``1/P`` (the mean over the ep ranks), the convention of data
parallelism, whose gradient reduction averages: composed with FSDP2 over the other data ranks, expert
and replicated gradients are then both the mean over all ranks (docs/distributed.md).
A token sends one row per selected expert (no per-rank deduplication of a token's pairs).

Routing stays local, so each rank's balancer counts (``step_counts``, indexed by the global expert id)
cover only its own tokens: the trainer sums them over all ranks before ``update_balance``
(``distributed.reduce.sync_balance_stats``), so every rank moves the same bias.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from longmoe.layers.moe import MoELayer
from longmoe.ops.moe import dispatch_experts

MeshLike = DeviceMesh | dist.ProcessGroup


def as_mesh(mesh: MeshLike, device: torch.device) -> DeviceMesh:
    """A 1-D ``DeviceMesh`` for ``mesh`` (a 1-D mesh as is, a process group wrapped)."""
    if isinstance(mesh, DeviceMesh):
        if mesh.ndim != 1:
            raise ValueError(
                f"mesh: expected a 1-D DeviceMesh, got {mesh.ndim} dimensions {mesh.mesh_dim_names}"
            )
        return mesh
    return DeviceMesh.from_group(mesh, device.type)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient multiplied by ``factor`` on the way back."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g * ctx.factor, None


class ExpertParallelDispatch:
    """The ``MoELayer.expert_dispatch`` of one layer over an expert-parallel group (module docstring).

    ``last_payload`` is the shape of the last dispatch payload (``[pairs sent, ℓ]``) and ``bytes_sent``
    counts the bytes this rank sent through both all-to-alls of every forward (counts excluded).
    """

    def __init__(self, mesh: DeviceMesh, n_experts: int, glu: str, impl: str) -> None:
        self.mesh, self.group = mesh, mesh.get_group()
        self.size, self.rank = mesh.size(), mesh.get_local_rank()
        self.n_local = n_experts // self.size
        self.glu, self.impl = glu, impl
        self.last_payload: tuple[int, ...] = ()
        self.bytes_sent = 0

    def __call__(
        self,
        z: torch.Tensor,
        idx: torch.Tensor,
        weights: torch.Tensor,
        w_in: torch.Tensor,
        w_out: torch.Tensor,
    ) -> torch.Tensor:
        # z [N, ℓ]; idx, weights [N, k]; w_in, w_out: DTensor Shard(0) (or local [E/P, ...]) -> [N, ℓ]
        w_in = w_in.to_local() if isinstance(w_in, DTensor) else w_in  # [E/P, ℓ, 2f]
        w_out = w_out.to_local() if isinstance(w_out, DTensor) else w_out  # [E/P, f, ℓ]
        w_in, w_out = _ScaleGrad.apply(w_in, 1.0 / self.size), _ScaleGrad.apply(w_out, 1.0 / self.size)
        N, k = idx.shape
        P, E_loc = self.size, self.n_local
        flat = idx.reshape(-1)  # [M] pair p = token · k + slot
        order = torch.argsort(flat, stable=True)  # pairs by expert = by destination rank
        send_counts = torch.bincount(flat, minlength=P * E_loc)  # [E] = [P, E/P] row-major
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)  # [P, E/P]: from rank s
        send_split = send_counts.view(P, E_loc).sum(1).tolist()
        recv_split = recv_counts.view(P, E_loc).sum(1).tolist()
        payload = z.index_select(0, order // k)  # [M, ℓ] latent rows in send order
        self.last_payload = tuple(payload.shape)
        recv = funcol.all_to_all_single_autograd(payload, recv_split, send_split, self.group)  # [R, ℓ]
        # row j came from source s for local expert e, grouped (s, e) in order: ids from the counts
        local_ids = torch.arange(E_loc, device=z.device).repeat(P)  # [P·E/P]
        rows_idx = torch.repeat_interleave(local_ids, recv_counts).unsqueeze(1)  # [R, 1]
        ones = torch.ones(rows_idx.shape, dtype=z.dtype, device=z.device)
        y_recv = dispatch_experts(recv, rows_idx, ones, w_in, w_out, self.glu, self.impl)  # [R, ℓ]
        y_sent = funcol.all_to_all_single_autograd(y_recv, send_split, recv_split, self.group)  # [M, ℓ]
        self.bytes_sent += (payload.numel() + y_recv.numel()) * z.element_size()
        Y = torch.empty_like(y_sent).index_copy(0, order, y_sent)  # [M, ℓ] back in pair order
        return torch.bmm(weights.to(Y.dtype).unsqueeze(1), Y.view(N, k, Y.shape[-1])).squeeze(1)  # [N, ℓ]


def _moe_layers(model: nn.Module) -> list[MoELayer]:
    return [m for m in model.modules() if isinstance(m, MoELayer)]


def apply_expert_parallel(model: nn.Module, ep_mesh: MeshLike) -> nn.Module:
    """Shard every ``MoELayer``'s routed experts over ``ep_mesh`` and dispatch tokens by all-to-all.

    ``ep_mesh``: a 1-D ``DeviceMesh`` (or a ``ProcessGroup``) of the ranks that share the experts; every
    rank must hold the same full weights when this is called (same seed, or a meta-device model that is
    initialised afterwards). ``n_experts`` must divide by its size. Returns ``model`` (changed in place).
    """
    layers = _moe_layers(model)
    if not layers:
        return model
    mesh = as_mesh(ep_mesh, layers[0].w_in.device)
    P, r = mesh.size(), mesh.get_local_rank()
    for layer in layers:
        E = layer.cfg.n_experts
        if E % P:
            raise ValueError(f"expert parallel: n_experts = {E} must be divisible by the ep degree {P}")
        if isinstance(layer.w_in, DTensor):
            raise ValueError("expert parallel: already applied to this model")
        n = E // P
        for name in ("w_in", "w_out"):
            full = getattr(layer, name)  # [E, ...]
            local = full.detach()[r * n : (r + 1) * n].clone()  # [E/P, ...]
            shard = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            setattr(layer, name, nn.Parameter(shard, requires_grad=full.requires_grad))
        layer.expert_dispatch = ExpertParallelDispatch(mesh, E, layer.cfg.glu, layer.impl)
    return model
