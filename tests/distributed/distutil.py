"""Helpers for multi-process tests: run a function on N gloo ranks and the small model and
curriculum the trainer tests share (unique module name: conftest imports would collide)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import torch.multiprocessing as mp

from longmoe.config import FFNConfig, ModelConfig
from longmoe.data.stages import CurriculumStage
from longmoe.distributed.parallel_dims import init_distributed, teardown
from longmoe.presets import preset
from longmoe.train.config import TrainConfig


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


def model_config() -> ModelConfig:
    return preset("tiny").replace(
        vocab_size=512, d_model=32, n_layers=4, kda_heads=2, kda_head_dim=8, kda_gate_rank=8,
        mla_heads=2, mla_head_dim=8, mla_v_head_dim=8, mla_q_lora_rank=16, mla_kv_lora_rank=8,
        attn_res_blocks=2,
        ffn=FFNConfig(kind="moe", dense_hidden=64, n_experts=4, top_k=2, n_shared=1, latent_ratio=2,
                      expert_hidden=16, shared_hidden=32, first_k_dense=1),
    )  # fmt: skip


def train_config() -> TrainConfig:
    # stage b: 1 long window + replay windows per batch, so the ranks' shares differ in length
    stages = [
        CurriculumStage("a", window=32, tokens=32 * 4 * 3, batch_size=4),
        CurriculumStage("b", window=64, tokens=64 * 3, batch_size=1, replay_fraction=0.5, replay_window=32),
    ]
    return TrainConfig(
        stages=stages, warmup_steps=1, eval_every=0, ckpt_every=3, val_windows=3, lr=3e-3, grad_clip=0.5
    )


def losses(run: Path) -> dict[int, float]:
    """Training loss by step from a run's metrics.jsonl."""
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}
