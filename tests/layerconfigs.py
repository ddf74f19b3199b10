"""One-layer ``ModelConfig``s small enough for exact layer tests (KDA, MLA, context parallel): each test
module overrides only the fields its cases are about."""

from __future__ import annotations

from longmoe.config import ModelConfig

SMALL = dict(
    vocab_size=64,
    d_model=32,
    n_layers=1,
    kda_heads=2,
    kda_head_dim=8,
    kda_gate_rank=4,
    kda_conv_size=4,
    attn_res_blocks=1,
)


def small_cfg(pattern: str = "L", **kw) -> ModelConfig:
    """A one-layer config of ``pattern`` (``"L"`` KDA or ``"M"`` MLA) with ``SMALL`` shapes."""
    return ModelConfig(**{**SMALL, "layer_pattern": pattern, **kw})
