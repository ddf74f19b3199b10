"""The parallel layout of a run: ``ParallelDims(dp_shard, ep, cp)``, its device mesh, and process helpers.

The world of ``dp_shard · ep · cp`` ranks is one 3-D ``DeviceMesh`` with named dims, innermost last
(adjacent ranks share the chattiest collectives: CP all-gathers, then EP all-to-alls)::

    mesh["dp_shard", "ep", "cp"]      shape (dp_shard, ep, cp)

- **data ranks** (``dp_shard · ep``): each reads its own windows of the global batch (EP ranks are data
  ranks too: they exchange tokens only inside the MoE layers); CP ranks share windows and split them
  along the sequence.
- **FSDP** shards every non-expert parameter over all ranks (``fsdp_mesh``: the three dims flattened),
  since each rank sees different tokens and its gradient must be reduced over all of them; routed
  experts, already split over ``ep``, are sharded over the rest (``expert_fsdp_mesh``: dp_shard × cp).

Without ``torchrun`` (no ``WORLD_SIZE`` in the environment) there is no process group: ``world_size()``
is 1, ``rank()`` 0, and training runs exactly as a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from longmoe.config import ConfigError

MESH_DIMS = ("dp_shard", "ep", "cp")
FLAGS = {"dp_shard": "--dp-shard", "ep": "--ep", "cp": "--cp"}


# ------------------------------------------------------------------------------------ process helpers
def launched() -> bool:
    """True inside a ``torchrun`` worker (the launcher sets ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def is_distributed() -> bool:
    """True when a default process group exists (this process is one rank of several, or of one)."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return dist.get_rank() if is_distributed() else int(os.environ.get("RANK", "0"))


def is_rank0() -> bool:
    return rank() == 0


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def backend_for(device: torch.device | str) -> str:
    """The collective backend for ``device``: NCCL on CUDA, gloo on CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def device_for_rank(device: str | torch.device) -> torch.device:
    """This rank's device: ``cuda`` becomes ``cuda:LOCAL_RANK`` (one GPU per process); CPU stays CPU."""
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", local_rank())
    return d


def init_distributed(device: str | torch.device = "cpu") -> torch.device:
    """Join the ``torchrun`` process group (gloo on CPU, NCCL on CUDA); returns this rank's device.

    Idempotent; a no-op returning ``device`` when the process was not launched by ``torchrun``.
    """
    d = device_for_rank(device)
    if not launched() or is_distributed():
        return d
    if d.type == "cuda":
        torch.cuda.set_device(d)
    dist.init_process_group(backend=backend_for(d), device_id=d if d.type == "cuda" else None)
    return d


def teardown() -> None:
    """Leave the process group (every rank must call it; harmless without one)."""
    if is_distributed():
        dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


# ------------------------------------------------------------------------------------ the layout
@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data sharding (FSDP2), expert parallelism and context parallelism; product = world."""

    dp_shard: int = 1
    ep: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for name in MESH_DIMS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{FLAGS[name]} ({name}) = {v!r} is invalid: expected an integer >= 1")

    @property
    def world_size(self) -> int:
        return self.dp_shard * self.ep * self.cp

    @property
    def data_degree(self) -> int:
        """Ranks that read different windows of the global batch (CP ranks share theirs)."""
        return self.dp_shard * self.ep

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def describe(self) -> str:
        return f"dp_shard={self.dp_shard}, ep={self.ep}, cp={self.cp}"

    def validate(self, world: int) -> None:
        """Raise ``ConfigError`` unless ``dp_shard · ep · cp == world`` (the number of processes)."""
        if self.world_size != world:
            raise ConfigError(
                f"--dp-shard {self.dp_shard} × --ep {self.ep} × --cp {self.cp} = {self.world_size}, but the "
                f"world size is {world} (torchrun --nproc-per-node × nodes): the product of the parallel "
                f"degrees must equal the number of processes"
            )

    @classmethod
    def for_world(cls, world: int, dp_shard: int | None = None, ep: int = 1, cp: int = 1) -> ParallelDims:
        """Dims for ``world`` ranks; ``dp_shard=None`` takes what ``ep`` and ``cp`` leave."""
        if dp_shard is None:
            if world % (ep * cp):
                raise ConfigError(
                    f"--ep {ep} × --cp {cp} = {ep * cp} does not divide the world size {world}: "
                    "pass --dp-shard explicitly or change the degrees"
                )
            dp_shard = world // (ep * cp)
        dims = cls(dp_shard, ep, cp)
        dims.validate(world)
        return dims

    @classmethod
    def parse(cls, text: str) -> ParallelDims:
        """``"dp_shard=8,ep=64,cp=16"`` (any subset; missing degrees are 1) -> ``ParallelDims``."""
        vals: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, val = part.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in MESH_DIMS or not val.strip().isdigit():
                raise ConfigError(
                    f"--parallel: cannot read {part!r}: expected comma-separated name=integer with names "
                    f"from {MESH_DIMS}, e.g. dp_shard=8,ep=64,cp=16"
                )
            vals[key] = int(val)
        return cls(**vals)

    # ------------------------------------------------------------------ meshes
    def build_mesh(self, device: torch.device | str) -> DeviceMesh:
        """The 3-D mesh over the current process group (call ``init_distributed`` first)."""
        self.validate(world_size())
        shape = tuple(getattr(self, n) for n in MESH_DIMS)
        return init_device_mesh(torch.device(device).type, shape, mesh_dim_names=MESH_DIMS)


def fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """1-D mesh over every rank: non-expert parameters are sharded (and gradients reduced) over all."""
    return mesh[MESH_DIMS]._flatten("fsdp")


def expert_fsdp_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """1-D mesh over dp_shard × cp: routed experts, already split over ``ep``, are sharded over these."""
    return mesh["dp_shard", "cp"]._flatten("expert_fsdp")


def data_rank(mesh: DeviceMesh) -> int:
    """This rank's index among the data ranks (its share of the global batch), in ``[0, dp_shard·ep)``."""
    return mesh["dp_shard"].get_local_rank() * mesh["ep"].size() + mesh["ep"].get_local_rank()
