"""The one place that decides which feed-forward a layer gets, so the MoE drops in by config alone."""

from __future__ import annotations

from torch import nn

from longmoe.config import ModelConfig
from longmoe.layers.mlp import GLUMLP
from longmoe.layers.moe import MoELayer


def build_ffn(cfg: ModelConfig, layer_idx: int) -> nn.Module:
    """Dense GLU MLP, or ``MoELayer(cfg.d_model, cfg.ffn)`` when ``cfg.is_moe_layer(layer_idx)``."""
    if cfg.is_moe_layer(layer_idx):
        return MoELayer(cfg.d_model, cfg.ffn, init_std=cfg.init_std)
    return GLUMLP(cfg.d_model, cfg.ffn.dense_hidden, cfg.ffn.glu)
