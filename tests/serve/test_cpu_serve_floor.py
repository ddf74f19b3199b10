"""bench/cpu_floor.py: the weight bytes one decoded token reads equal a hand count on a tiny
Kimi-Linear-shaped config, per precision."""

from __future__ import annotations

import pytest

from bench.cpu_floor import active_bytes, active_flops, prefill_flops, weight_bytes
from longmoe.interop.kimi_config import config_from_hf

HF = {  # d 64, vocab 512, layers L L L M L, 8 experts top-3 of width 32 + 1 shared, first layer dense 96
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 5,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "kv_lora_rank": 32,
    "q_lora_rank": None,
    "qk_rope_head_dim": 8,
    "mla_use_nope": True,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "num_experts_per_token": 3,
    "num_experts": 8,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "model_max_length": 4096,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3, 5],
        "full_attn_layers": [4],
        "head_dim": 16,
        "num_heads": 2,
        "short_conv_kernel_size": 4,
    },
}
# hand count of the weights one token reads
KDA = 64 + 96 * 4 + 2 + (3 * 32 + 16 + 16 + 2) * 64 + 32 * 16 + (32 * 16 + 32) + 16 + 64 * 32 + 64
MLA = 64 + (2 * 24 + 40) * 64 + 32 + 64 * 32 + 64 * 32 + 64
DENSE = 192 * 64 + 64 * 96
ROUTED = 3 * (64 * 64 + 32 * 64)  # top-3 experts, gate+up [64, 64] and down [64, 32] each
MOE = 8 * 64 + (64 * 64 + 64 * 32) + ROUTED
LM_HEAD = 512 * 64
PARAMS = 64 + LM_HEAD + 64 + 4 * KDA + MLA + DENSE + 4 * MOE  # embed row, head, final norm, blocks
VECTORS = 4 * (64 + 32 + 16 + 64) + (64 + 32 + 64) + 64  # norms and the KDA gate bias


@pytest.fixture(scope="module")
def cfg():
    return config_from_hf(HF)


def test_fp32_bytes_per_token_are_the_hand_count(cfg):
    b = active_bytes(cfg, "fp32")
    assert b["total"] == pytest.approx(4 * PARAMS)
    assert b["routed"] == pytest.approx(4 * 4 * ROUTED)
    assert b["lm_head"] == 4 * LM_HEAD and b["embed"] == 4 * 64
    assert active_bytes(cfg, "f32") == b


def test_q8_0_and_int8_store_matrices_as_each_engine_does(cfg):
    q8 = active_bytes(cfg, "q8_0")
    assert q8["lm_head"] == pytest.approx(LM_HEAD * 34 / 32)  # rows of 64: q8_0 blocks
    assert q8["routed"] == pytest.approx(4 * ROUTED * 34 / 32)
    i8 = active_bytes(cfg, "int8")
    assert i8["lm_head"] == pytest.approx(
        LM_HEAD * (1 + 2 / 64)
    )  # the bench packs the head (--quantize-head)
    # experts: int8 + a bf16 scale per row; longmoe stores both stacks with rows of d = 64
    assert i8["routed"] == pytest.approx(4 * ROUTED * (1 + 2 / 64))
    assert q8["total"] < 0.5 * active_bytes(cfg, "fp32")["total"]
    assert weight_bytes(cfg, "fp32") > active_bytes(cfg, "fp32")["total"]


def test_flops_count_active_matrices_and_grow_with_context(cfg):
    base = active_flops(cfg, 0)
    mats = 2 * (PARAMS - 64 - VECTORS)  # no embedding lookup, no vectors
    assert base == pytest.approx(mats + 4 * 2 * 4 * 16 * 16)  # + the KDA state update and read
    per_pos = 1 * 2 * 2 * (24 + 16)  # one MLA layer, 2 heads, scores over 24 dims + values of 16
    assert active_flops(cfg, 100) - base == pytest.approx(100 * per_pos)
    assert prefill_flops(cfg, 100) == pytest.approx(100 * base + 100 * per_pos * 100 / 2)
