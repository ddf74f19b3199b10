"""A tiny random model saved with its tokenizer, shared by the agent tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from agentutil import VOCAB, tiny_model

from longmoe.data.tokenizer import tokenizer_for_tests


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("agent_model")
    tiny_model().save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d
