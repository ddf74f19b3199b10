"""Serving-test helpers (a unique module name: ``from conftest import`` collides across test folders)."""

from __future__ import annotations

import torch

from longmoe.config import preset
from longmoe.model import LongMoE

VOCAB = 512
MAX_CONTEXT = 1024


def tiny_model(seed: int = 0, **kw) -> LongMoE:
    """The ``tiny`` preset (vocab 512) with weights moved off init, and untied
    embeddings (tied random ones make a model that repeats its input), so greedy outputs vary."""
    torch.manual_seed(seed)
    kw = {"vocab_size": VOCAB, "max_seq_len": MAX_CONTEXT, "tie_embeddings": False, **kw}
    cfg = preset("tiny").replace(**kw)
    m = LongMoE(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()
