"""Run a test body on ``world`` gloo processes: ``run_ranks(fn, *args)`` calls ``fn(rank, world, *args)``.

``fn`` must be a module-level function (it is pickled by name). The processes come from a forkserver
that has imported torch and longmoe once per test session, so a launch costs a fork, not an import;
each joins a fresh gloo group through a ``TCPStore`` the caller holds (on a port the OS picked, so no
race for a free port with other test runs), with the ``torchrun`` environment variables set (so
longmoe's ``init_distributed`` sees a launched rank and the trainer runs as under ``torchrun``), runs
single-threaded, and any exception or a timeout fails the calling test.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT_S = 120  # one collective (or joining the group)
RUN_TIMEOUT_S = 600  # the whole launch: trainer runs take minutes on shared cores
HOST = "127.0.0.1"
_PRELOAD = ["torch", "torch.distributed", "longmoe.model"]


def free_port() -> int:
    """A port free now (for a launcher that picks its own rendezvous, e.g. ``torchrun``)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR=HOST, MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
    )  # fmt: skip
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    store = dist.TCPStore(HOST, port, world_size=world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        fn(rank, world, *args)
    finally:
        if dist.is_initialized():  # the body may have left the group itself (``teardown``)
            dist.destroy_process_group()


def run_ranks(fn: Callable, *args: object, world: int = 2, timeout: float = RUN_TIMEOUT_S) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` processes; raise if any fails or all exceed ``timeout``."""
    multiprocessing.set_forkserver_preload(_PRELOAD)
    store = dist.TCPStore(HOST, 0, world_size=world, is_master=True, wait_for_workers=False)
    ctx = mp.start_processes(
        _entry, args=(world, store.port, fn, args), nprocs=world, join=False, start_method="forkserver"
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{fn.__name__}: {world} ranks did not finish within {timeout} s")
