"""Shared fixtures for the serving tests: a tiny random model saved with its tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from serveutil import VOCAB, tiny_model, tiny_vision_model

from longmoe.data.tokenizer import tokenizer_for_tests


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny_model")
    tiny_model().save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory) -> Path:
    """A tiny random model with an image encoder (``serveutil.VISION``), saved with its tokenizer."""
    d = tmp_path_factory.mktemp("tiny_vision")
    tiny_vision_model().save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d
