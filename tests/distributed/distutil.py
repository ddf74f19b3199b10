"""Helpers for multi-process tests: run a function on N gloo ranks (unique module name, see trainutil)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch.multiprocessing as mp

from longmoe.distributed.parallel_dims import init_distributed, teardown


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn: Callable, args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
    )  # fmt: skip
    init_distributed("cpu")
    try:
        fn(rank, *args)
    finally:
        teardown()


def run_ranks(fn: Callable, world: int, *args: object) -> None:
    """Run ``fn(rank, *args)`` in ``world`` spawned processes joined in a gloo group; re-raises failures."""
    mp.spawn(_worker, args=(world, free_port(), fn, args), nprocs=world, join=True)
