"""The model of every arm: small hybrid stacks that train on one CPU thread in seconds per step.

Arms of a study differ only in the ablated choice; where that changes the parameter count (attention
residuals add one pseudo-query vector per sublayer) the plain arm's dense FFN is widened to match.
"""

from __future__ import annotations

import dataclasses

from longmoe.config import FFNConfig, ModelConfig
from longmoe.model import LongMoE
from longmoe.pipelines.ablations.config import AblationConfig, RunKey


def _stack(vocab: int, d: int, n_layers: int, heads: int, blocks: int, ffn: FFNConfig) -> ModelConfig:
    """A NoPE hybrid (3:1 KDA:MLA, or ``LM`` for two layers) of width ``d``, heads of 32."""
    return ModelConfig(
        vocab_size=vocab, d_model=d, n_layers=n_layers, layer_pattern="LLLM" if n_layers % 4 == 0 else "LM",
        max_seq_len=4096, kda_heads=heads, kda_head_dim=32, kda_gate_rank=8, mla_heads=heads,
        mla_q_lora_rank=32, mla_kv_lora_rank=16, mla_head_dim=32, mla_v_head_dim=32,
        attn_res_blocks=blocks, ffn=ffn,
    )  # fmt: skip


def tiny(vocab: int) -> ModelConfig:
    """d = 64, 4 layers (LLLM), dense SwiGLU 128, 2 attention-residual blocks."""
    return _stack(vocab, 64, 4, 2, 2, FFNConfig(kind="dense", dense_hidden=128))


def deep(vocab: int) -> ModelConfig:
    """Deeper and thinner: d = 32, 12 layers (3 × LLLM), dense SwiGLU 64, 4 attention-residual blocks."""
    return _stack(vocab, 32, 12, 1, 4, FFNConfig(kind="dense", dense_hidden=64))


def moe(vocab: int, cfg: AblationConfig, balancer: str) -> ModelConfig:
    """d = 64, ``LM``, both FFNs MoE with E = ``balance_experts`` (top-``balance_top_k``, latent α = 2,
    expert hidden 16, one shared expert of 64), balanced by ``balancer``."""
    ffn = FFNConfig(
        kind="moe", n_experts=cfg.balance_experts, top_k=cfg.balance_top_k, n_shared=1, latent_ratio=2,
        expert_hidden=16, shared_hidden=64, first_k_dense=0, balancer=balancer, bias_step=cfg.bias_step,
        aux_loss_coef=cfg.aux_coef,
    )  # fmt: skip
    return _stack(vocab, 64, 2, 2, 2, ffn)


def n_params(mcfg: ModelConfig) -> int:
    return LongMoE(mcfg).num_parameters()


def match_params(mcfg: ModelConfig, target: int) -> ModelConfig:
    """``mcfg`` with its dense FFN width changed so the parameter count is the closest to ``target``."""
    if mcfg.ffn.kind != "dense":
        raise ValueError("match_params: expected a dense-FFN model (its width is what is resized)")
    width = lambda h: mcfg.replace(ffn=dataclasses.replace(mcfg.ffn, dense_hidden=h))
    per_unit = 3 * mcfg.d_model * mcfg.n_layers  # a SwiGLU hidden unit: gate, up and down weights
    guess = mcfg.ffn.dense_hidden + round((target - n_params(mcfg)) / per_unit)
    best = min((max(1, guess + k) for k in (-1, 0, 1)), key=lambda h: abs(n_params(width(h)) - target))
    return width(best)


def model_for(key: RunKey, cfg: AblationConfig, vocab: int) -> ModelConfig:
    """The model of one run (see the module doc)."""
    if key.study == "decay":
        return tiny(vocab).replace(kda_gate=key.arm.removesuffix("-hot"))
    if key.study == "attnres":
        res, depth = key.arm.split("-")
        base = tiny(vocab) if depth == "tiny" else deep(vocab)
        if res == "attnres":
            return base
        return match_params(base.replace(attn_res=False), n_params(base))
    return moe(vocab, cfg, key.arm)
