"""Tiny models and configs: the ``tiny`` preset at four layers, moved off init (serving, agent, RL
tests) and one-layer configs small enough for exact layer tests (KDA, MLA, context parallel)."""

from __future__ import annotations

import torch

from longmoe.config import ModelConfig, VisionConfig
from longmoe.model import LongMoE
from longmoe.presets import preset

VOCAB = 512  # >= what tokenizer_for_tests(512) needs
MAX_CONTEXT = 1024
NUDGE_SCALE = 0.05

VISION = VisionConfig(patch_size=4, max_image_side=32, encoder="vit", width=32, depth=1, heads=2)


def nudge_off_init(model: torch.nn.Module, scale: float = NUDGE_SCALE) -> torch.nn.Module:
    """Add ``scale`` x N(0, 1) noise to every parameter, in place: init leaves norms at 1, gates and
    biases at 0, so a model fresh from init hides bugs that non-trivial weights show."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


# half the preset's depth: LLLM once (KDA, MLA, MoE FFNs, two AttnRes blocks: every kind of layer the
# serving paths meet) at half the time per engine step
TINY_DEPTH = {"n_layers": 4, "attn_res_blocks": 2}


def tiny_model(seed: int = 0, **kw) -> LongMoE:
    """The ``tiny`` preset at ``TINY_DEPTH`` (vocab 512) with weights moved off init, and untied
    embeddings (tied random ones make a model that repeats its input), so greedy outputs vary."""
    torch.manual_seed(seed)
    kw = {"vocab_size": VOCAB, "max_seq_len": MAX_CONTEXT, "tie_embeddings": False, **TINY_DEPTH, **kw}
    m = LongMoE(preset("tiny").replace(**kw))
    nudge_off_init(m)
    return m.eval()


def tiny_vision_model(seed: int = 0, **kw) -> LongMoE:
    """``tiny_model`` with a small ViT image encoder (4-pixel patches, images scaled to <= 32 px)."""
    return tiny_model(seed, vision=VISION, **kw)


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
    """A one-layer config of ``pattern`` (``"L"`` KDA or ``"M"`` MLA) with ``SMALL`` shapes; each test
    module overrides only the fields its cases are about."""
    return ModelConfig(**{**SMALL, "layer_pattern": pattern, **kw})


def constant_reply_model(token: int, seed: int = 0) -> LongMoE:
    """``tiny_model`` rewired so greedy decoding always picks ``token`` (``bench.reply_ids.answer_only``,
    the model the reply-id benchmark measures)."""
    from bench.reply_ids import answer_only

    return answer_only(tiny_model(seed), token)
