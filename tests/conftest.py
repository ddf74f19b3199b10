"""Fixtures shared across test folders (helpers live in ``tests/helpers``, see tests/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from longmoe.data.tokenizer import Tokenizer
from tests.helpers.models import VOCAB, tiny_model, tiny_vision_model
from tests.helpers.tokenizer import tokenizer_for_tests


@pytest.fixture(scope="session")
def tok() -> Tokenizer:
    """The shared 512-token test tokenizer (modules that need another define their own ``tok``)."""
    return tokenizer_for_tests(VOCAB)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """``tiny_model()`` saved with its tokenizer: what ``Engine.from_dir`` and the CLIs load."""
    d = tmp_path_factory.mktemp("tiny_model")
    tiny_model().save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory) -> Path:
    """``tiny_vision_model()`` (``models.VISION`` encoder) saved with its tokenizer."""
    d = tmp_path_factory.mktemp("tiny_vision")
    tiny_vision_model().save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d
