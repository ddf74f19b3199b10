"""Parameter accounting from a config alone: counts by part, total and active per token, and the
vision encoder's cost per image.

Nothing is instantiated (the flagship has trillions of parameters); every count comes from the
layers' own ``param_count`` formulas and ``MoELayer.analytic_param_counts``, and the tests check them
against real modules on the tiny preset. ``longmoe inspect`` (``cli/inspect.py``) prints them.
"""

from __future__ import annotations

from typing import Any

from longmoe.config import ModelConfig
from longmoe.layers.attnres import BlockAttnRes
from longmoe.layers.kda import KDALayer
from longmoe.layers.mla import MLALayer
from longmoe.layers.mlp import GLUMLP
from longmoe.layers.moe import MoELayer
from longmoe.layers.vision import ConvPatchFeatures, VisionEncoder

PARTS = (
    "embeddings",
    "kda",
    "mla",
    "dense_ffn",
    "routed_experts",
    "shared_experts",
    "router",
    "latent_proj",
    "norms",
    "attn_res",
    "vision",
)
# Image sizes (height, width) whose token cost ``inspect`` reports besides the largest image.
IMAGE_SIZES = {"640x480 photo": (480, 640), "1700x2200 page": (2200, 1700), "256x256 icon": (256, 256)}


def _moe_counts(cfg: ModelConfig, active: bool) -> dict[str, int]:
    fn = MoELayer.active_param_counts if active else MoELayer.analytic_param_counts
    return fn(cfg.d_model, cfg.ffn)


def param_counts(cfg: ModelConfig, active: bool = False) -> dict[str, int]:
    """Parameters by part; ``active=True`` counts what one token touches (``top_k`` routed experts)."""
    d, types = cfg.d_model, cfg.layer_types
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    c = dict.fromkeys(PARTS, 0)
    c["embeddings"] = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    c["kda"] = types.count("L") * KDALayer.param_count(cfg)
    c["mla"] = types.count("M") * MLALayer.param_count(cfg)
    c["dense_ffn"] = (cfg.n_layers - n_moe) * GLUMLP.param_count(d, cfg.ffn.dense_hidden)
    if n_moe:
        for k, v in _moe_counts(cfg, active).items():
            c[k] += n_moe * v
    c["norms"] = (2 * cfg.n_layers + 1) * d  # two pre-norms per layer + final (mixer-internal: in kda/mla)
    if cfg.attn_res:
        c["attn_res"] = BlockAttnRes.param_count(2 * cfg.n_layers + 1, d)
    if cfg.vision is not None and not active:  # a text token never runs the vision encoder; an image
        c["vision"] = VisionEncoder.param_count(cfg.vision, d)  # patch runs all of it (see "vision:")
    return c


def vision_accounting(cfg: ModelConfig) -> dict[str, Any] | None:
    """Tokens per image (patches + the two markers) at the largest size and a few common ones, and the
    encoder's forward FLOPs per patch (2 per multiply-add; ViT attention over the largest image)."""
    v = cfg.vision
    if v is None:
        return None
    g = v.max_grid
    sizes = {f"max ({v.max_image_side}x{v.max_image_side})": (v.max_image_side, v.max_image_side)}
    sizes.update(IMAGE_SIZES)
    tokens = {}
    for name, (h, w) in sizes.items():
        rh, rw = v.resized_size(h, w)
        tokens[name] = {"resized": f"{rw}x{rh}", "tokens": v.image_tokens(h, w)}
    width = cfg.d_model if v.encoder == "linear" else v.width
    tables = 2 * g * width  # row/column position tables: lookups, no FLOPs
    flops = 2 * (VisionEncoder.param_count(v, cfg.d_model) - tables)  # every other weight: one multiply-add
    if v.encoder == "conv":  # the convolutions slide: their weights are used at every output position
        flops += ConvPatchFeatures.flops_per_patch(v) - 2 * ConvPatchFeatures.param_count(v)
    if v.encoder == "vit":
        flops += v.depth * 4 * g * g * v.width  # QKᵀ and AV against every patch of the largest image
    return {
        "encoder": v.encoder,
        "patch_size": v.patch_size,
        "max_image_side": v.max_image_side,
        "max_patches": g * g,
        "image_tokens": tokens,
        "encoder_flops_per_patch": flops,
    }
