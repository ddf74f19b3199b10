"""A tiny random transformers ``KimiLinearForCausalLM`` with every parameter made non-trivial (interop
tests; ``transformers`` is imported lazily, so the module imports without it)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

VOCAB = 512  # >= what tokenizer_for_tests needs, so the engine can run on the converted model
PROMPT_LENGTHS = (1, 7, 16, 37, 70)  # inside one chunk, on the boundary, across several (16 and 64)


def hf_config(**overrides):
    from transformers import KimiLinearConfig

    kw = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=64,
        moe_intermediate_size=24,
        num_hidden_layers=5,
        num_attention_heads=2,
        num_key_value_heads=2,
        kv_lora_rank=16,
        q_lora_rank=24,
        qk_rope_head_dim=0,
        qk_nope_head_dim=16,
        v_head_dim=12,
        num_experts_per_tok=3,
        num_experts=8,
        n_group=4,
        topk_group=2,
        n_shared_experts=2,
        routed_scaling_factor=2.446,
        first_k_dense_replace=1,
        initializer_range=0.08,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        linear_attn_config={
            "kda_layers": [1, 2, 3, 5],
            "full_attn_layers": [4],
            "head_dim": 16,
            "num_heads": 3,
            "short_conv_kernel_size": 4,
        },
    )
    kw.update(overrides)
    return KimiLinearConfig(**kw)


def hf_model(seed: int = 0, **overrides):
    """Random weights with the parts init leaves constant (norms, biases) randomised too, and forget gates
    at real Kimi-Linear values: ``A_log = log U(1, 16)``, so per-token log-decays reach well below −88
    over a chunk (the regime the factorised chunk form cannot represent)."""
    from transformers import KimiLinearForCausalLM

    logging.getLogger("transformers").setLevel(logging.ERROR)
    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(hf_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn_like(p) + math.log(math.expm1(1.0)))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))
    return model


def save_hf(model, path: Path) -> Path:
    model.save_pretrained(path, max_shard_size="100KB")  # several shards + the index
    return path
