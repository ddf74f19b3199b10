"""Shared fixtures for the serving tests: a tiny random model saved with its tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from longmoe.config import preset
from longmoe.data.tokenizer import tokenizer_for_tests
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


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny_model")
    tiny_model().save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d
