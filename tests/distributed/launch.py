"""Run a test body on ``world`` gloo processes: ``run_ranks(fn, *args)`` calls ``fn(rank, world, *args)``.

``fn`` must be a module-level function (it is pickled by name). The processes come from a forkserver
that has imported torch and longmoe once per test session, so a launch costs a fork, not an import;
each joins a fresh gloo group through a ``TCPStore`` the caller holds (on a port the OS picked, so no
race for a free port with other test runs), runs single-threaded, and any exception or a timeout fails
the calling test.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 120
HOST = "127.0.0.1"
_PRELOAD = ["torch", "torch.distributed", "longmoe.model"]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple) -> None:
    torch.set_num_threads(1)
    timeout = timedelta(seconds=TIMEOUT_S)
    store = dist.TCPStore(HOST, port, world_size=world, is_master=False, timeout=timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable, *args: object, world: int = 2, timeout: float = TIMEOUT_S) -> None:
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
