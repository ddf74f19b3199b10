"""Trainer-test helpers: a very small MoE config and a 2-stage curriculum (unique module name:
``conftest`` imports would collide with other test folders)."""

from __future__ import annotations

from longmoe.config import FFNConfig
from longmoe.data.stages import CurriculumStage
from longmoe.presets import preset
from longmoe.train.config import TrainConfig


def small_model_config():
    return preset("tiny").replace(
        vocab_size=512, d_model=64, n_layers=4, kda_heads=2, kda_head_dim=16, kda_gate_rank=8,
        mla_heads=2, mla_head_dim=16, mla_v_head_dim=16, mla_q_lora_rank=32, mla_kv_lora_rank=16,
        attn_res_blocks=2,
        ffn=FFNConfig(kind="moe", dense_hidden=128, n_experts=8, top_k=2, n_shared=1, latent_ratio=2,
                      expert_hidden=32, shared_hidden=64, first_k_dense=1),
    )  # fmt: skip


def small_train_config(**kw):
    stages = [
        CurriculumStage("a", window=64, tokens=64 * 4 * 6, batch_size=4),
        CurriculumStage(
            "b", window=128, tokens=128 * 2 * 4, batch_size=2, replay_fraction=0.25, replay_window=64
        ),
    ]
    base = dict(stages=stages, warmup_steps=2, eval_every=5, ckpt_every=3, val_windows=2, lr=3e-3)
    base.update(kw)
    return TrainConfig(**base)
