"""The named model presets (``--preset``): from ``tiny`` (trains on a 2-core CPU in minutes) to
``flagship`` (the seeds' scale, for accounting only). ``preset(name)`` builds a fresh ``ModelConfig``.
"""

from __future__ import annotations

from longmoe.config import FFNConfig, ModelConfig, VisionConfig
from longmoe.validation import ConfigError


def _tiny() -> ModelConfig:
    """Trains on a 2-core CPU in minutes: hidden 128, 8 layers (3:1 KDA:MLA), 8 experts top-2."""
    return ModelConfig(
        vocab_size=2048,
        d_model=128,
        n_layers=8,
        layer_pattern="LLLM",
        max_seq_len=4096,
        kda_heads=2,
        kda_head_dim=32,
        kda_gate_rank=16,
        mla_heads=2,
        mla_q_lora_rank=64,
        mla_kv_lora_rank=32,
        mla_head_dim=32,
        mla_v_head_dim=32,
        attn_res_blocks=4,
        ffn=FFNConfig(
            kind="moe",
            dense_hidden=256,
            n_experts=8,
            top_k=2,
            n_shared=1,
            latent_ratio=2,
            expert_hidden=64,
            shared_hidden=128,
            first_k_dense=1,
        ),
    )


def _small() -> ModelConfig:
    """A few hundred million parameters (total), GPU-trainable."""
    return ModelConfig(
        vocab_size=32768,
        d_model=1024,
        n_layers=16,
        layer_pattern="LLLM",
        max_seq_len=32768,
        kda_heads=8,
        kda_head_dim=128,
        kda_gate_rank=64,
        mla_heads=8,
        mla_q_lora_rank=384,
        mla_kv_lora_rank=256,
        mla_head_dim=128,
        mla_v_head_dim=128,
        attn_res_blocks=4,
        ffn=FFNConfig(
            kind="moe",
            dense_hidden=2816,
            n_experts=64,
            top_k=6,
            n_shared=1,
            latent_ratio=4,
            expert_hidden=512,
            shared_hidden=1024,
            first_k_dense=1,
        ),
    )


# The flagship's vision encoder. Assumed numbers (the seeds name a natively multimodal model, not its
# encoder): 14-pixel patches, images up to 896 px a side (64 × 64 = 4096 patches), a ViT 1024 wide
# and 24 deep with 16 heads (~0.4B parameters, the size of common open ViT-L/so400m encoders).
FLAGSHIP_VISION = VisionConfig(
    patch_size=14, max_image_side=896, encoder="vit", width=1024, depth=24, heads=16
)


def _flagship() -> ModelConfig:
    """The seeds' scale (accounting only, never instantiated): 896 routed experts, 1M context.

    ``longmoe inspect --preset flagship``: ~2.83T total, ~104B active per token (24 of 896 latent
    experts at α = 2, one shared expert), untied embeddings; plus a 0.4B ViT for images
    (``FLAGSHIP_VISION``).
    """
    return ModelConfig(
        vocab_size=163840,
        d_model=7168,
        n_layers=64,
        layer_pattern="LLLM",
        max_seq_len=1 << 20,
        kda_heads=64,
        kda_head_dim=128,
        kda_gate_rank=128,
        mla_heads=64,
        mla_q_lora_rank=1536,
        mla_kv_lora_rank=512,
        mla_head_dim=192,
        mla_v_head_dim=128,
        attn_res_blocks=8,
        dtype="bfloat16",
        tie_embeddings=False,
        ffn=FFNConfig(
            kind="moe",
            dense_hidden=18432,
            n_experts=896,
            top_k=24,
            n_shared=1,
            latent_ratio=2,
            expert_hidden=4608,
            shared_hidden=4096,
            first_k_dense=1,
        ),
        vision=FLAGSHIP_VISION,
    )


def _tiny_dense() -> ModelConfig:
    """``tiny`` with a dense SwiGLU FFN everywhere (the MoE-free baseline / ablation)."""
    cfg = _tiny()
    return cfg.replace(ffn=FFNConfig(kind="dense", dense_hidden=cfg.ffn.dense_hidden))


def _tiny_vision() -> ModelConfig:
    """``tiny`` that also reads images: 8-pixel patches up to 120 px a side (15 × 15 patches: the largest
    image, 227 tokens, fits the default curriculum's 256-token windows), a 2-layer ViT 128 wide."""
    return _tiny().replace(
        vision=VisionConfig(patch_size=8, max_image_side=120, encoder="vit", width=128, depth=2, heads=4)
    )


PRESETS = {
    "tiny": _tiny,
    "tiny-dense": _tiny_dense,
    "tiny-vision": _tiny_vision,
    "small": _small,
    "flagship": _flagship,
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
