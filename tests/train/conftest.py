"""Fixtures for trainer tests (helpers live in ``trainutil``)."""

from __future__ import annotations

import pytest
from trainutil import small_model_config, small_train_config


@pytest.fixture
def mcfg():
    return small_model_config()


@pytest.fixture
def tcfg():
    return small_train_config()


@pytest.fixture(scope="session")
def tok():
    from longmoe.data.tokenizer import tokenizer_for_tests

    return tokenizer_for_tests(512)
