"""Trainer-test configs: a small MoE model with a 2-stage curriculum (one process), a smaller pair for
multi-process runs, and the losses a run logged."""

from __future__ import annotations

import json
from pathlib import Path

from longmoe.config import FFNConfig, ModelConfig
from longmoe.data.stages import CurriculumStage
from longmoe.presets import preset
from longmoe.train.config import TrainConfig


def small_model_config() -> ModelConfig:
    return preset("tiny").replace(
        vocab_size=512, d_model=64, n_layers=4, kda_heads=2, kda_head_dim=16, kda_gate_rank=8,
        mla_heads=2, mla_head_dim=16, mla_v_head_dim=16, mla_q_lora_rank=32, mla_kv_lora_rank=16,
        attn_res_blocks=2,
        ffn=FFNConfig(kind="moe", dense_hidden=128, n_experts=8, top_k=2, n_shared=1, latent_ratio=2,
                      expert_hidden=32, shared_hidden=64, first_k_dense=1),
    )  # fmt: skip


def small_train_config(**kw) -> TrainConfig:
    stages = [
        CurriculumStage("a", window=64, tokens=64 * 4 * 6, batch_size=4),
        CurriculumStage(
            "b", window=128, tokens=128 * 2 * 4, batch_size=2, replay_fraction=0.25, replay_window=64
        ),
    ]
    base = dict(stages=stages, warmup_steps=2, eval_every=5, ckpt_every=3, val_windows=2, lr=3e-3)
    base.update(kw)
    return TrainConfig(**base)


def dist_model_config() -> ModelConfig:
    """Half the width of ``small_model_config`` and 4 experts: cheap on several processes."""
    return preset("tiny").replace(
        vocab_size=512, d_model=32, n_layers=4, kda_heads=2, kda_head_dim=8, kda_gate_rank=8,
        mla_heads=2, mla_head_dim=8, mla_v_head_dim=8, mla_q_lora_rank=16, mla_kv_lora_rank=8,
        attn_res_blocks=2,
        ffn=FFNConfig(kind="moe", dense_hidden=64, n_experts=4, top_k=2, n_shared=1, latent_ratio=2,
                      expert_hidden=16, shared_hidden=32, first_k_dense=1),
    )  # fmt: skip


def dist_train_config() -> TrainConfig:
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
