"""Fixtures for trainer tests (configs live in ``tests.helpers.train``; ``tok`` in tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.helpers.train import small_model_config, small_train_config


@pytest.fixture
def mcfg():
    return small_model_config()


@pytest.fixture
def tcfg():
    return small_train_config()
