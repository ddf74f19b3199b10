"""Memory estimates from a config alone: the bytes training needs before the first batch (weights,
gradients, AdamW moments), the serving cache per token and per sequence against full attention, and
the weight bytes after quantization. ``longmoe inspect`` prints them; the trainers refuse a model that
cannot fit (``check_memory``) before allocating it.
"""

from __future__ import annotations

from typing import Any

from longmoe.accounting import param_counts
from longmoe.config import ModelConfig
from longmoe.quantize import quantized_footprint
from longmoe.runtime import available_memory_bytes
from longmoe.validation import ConfigError

BF16_BYTES = 2
FP32_BYTES = 4  # KDA recurrent states are kept in fp32 in the cache
DTYPE_BYTES = {"float32": FP32_BYTES, "bfloat16": BF16_BYTES}
# Training holds four copies of every parameter in its dtype: weights, gradients, AdamW's two moments.
TRAIN_COPIES = {"weights": 1, "gradients": 1, "optimizer": 2}
CONTEXTS = {"8K": 8 * 1024, "128K": 128 * 1024, "1M": 1024 * 1024}


def cache_accounting(cfg: ModelConfig) -> dict[str, Any]:
    """Cache bytes: MLA cache rows (bf16: the latent and the shared key part, ``d_c + d_r``) per token, KDA
    states (fp32) + conv tails (bf16) per sequence."""
    types = cfg.layer_types
    n_l, n_m = types.count("L"), types.count("M")
    hk = cfg.kda_heads * cfg.kda_head_dim
    kda_state = n_l * (hk * cfg.kda_head_dim * FP32_BYTES + (cfg.kda_conv_size - 1) * 3 * hk * BF16_BYTES)
    latent = n_m * (cfg.mla_kv_lora_rank + cfg.mla_shared_key_dim) * BF16_BYTES
    mha = 2 * cfg.n_layers * cfg.d_model * BF16_BYTES  # K and V of every layer, heads × head_dim = d
    ctx = {
        name: {
            "hybrid_bytes": kda_state + n * latent,
            "full_mha_bytes": n * mha,
            "ratio": (n * mha) / (kda_state + n * latent),
        }
        for name, n in CONTEXTS.items()
    }
    return {
        "mla_latent_bytes_per_token": latent,
        "kda_state_bytes_per_sequence": kda_state,
        "full_mha_kv_bytes_per_token": mha,
        "mla_shared_key_bytes_per_token": n_m * cfg.mla_shared_key_dim * BF16_BYTES,  # included above
        "contexts": ctx,
    }


def training_memory(cfg: ModelConfig) -> dict[str, int]:
    """Bytes that training needs before the first batch: weights, gradients and AdamW moments
    (activations come on top, so this is a lower bound)."""
    per_copy = sum(param_counts(cfg).values()) * DTYPE_BYTES[cfg.dtype]
    out = {name: n * per_copy for name, n in TRAIN_COPIES.items()}
    out["total"] = sum(out.values())
    return out


def check_memory(cfg: ModelConfig, available: int | None = None) -> None:
    """Refuse a model whose weights, gradients and AdamW moments alone exceed the memory left
    (``available``: bytes, default measured now) instead of failing deep inside an allocation."""
    need = training_memory(cfg)["total"]
    have = available_memory_bytes() if available is None else available
    if have is not None and need > have:
        raise ConfigError(
            f"this model needs at least {need / 2**30:,.1f} GiB to train (weights, gradients and AdamW "
            f"moments in {cfg.dtype}, before activations) but only {have / 2**30:,.1f} GiB of memory is "
            "available: choose a smaller preset or config (`longmoe inspect` shows the accounting)"
        )


def weight_footprint(cfg: ModelConfig, mode: str) -> dict[str, Any]:
    """Weight bytes in the config's dtype and after ``quantize_model(mode)`` (longmoe/quantize.py)."""
    full, q = quantized_footprint(cfg, None), quantized_footprint(cfg, mode)
    return {"dtype": cfg.dtype, "bytes": full["total"], mode: q, "ratio": q["total"] / full["total"]}
