"""Fixtures shared across test folders (helpers live in ``tests/helpers``, see tests/README.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from longmoe.data.tokenizer import Tokenizer
from longmoe.model import LongMoE
from longmoe.serve.engine import Engine, EngineConfig
from tests.helpers.models import VOCAB, tiny_model, tiny_vision_model
from tests.helpers.tiers import SLOW_WITHOUT_WALL, is_integration, missing_wall
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


@pytest.fixture(scope="module")
def make_engine(model_dir, tok) -> Iterator[Callable[..., Engine]]:
    """The one engine factory: engines for a test module, closed when it ends.
    ``make_engine(**fields)``: the tiny model saved in ``model_dir`` (``Engine.from_dir``, so
    ``draft_model`` works too); ``make_engine(model, draft=None, **fields)``: a model in memory with
    the shared tokenizer. ``fields`` are ``EngineConfig``'s."""
    made: list[Engine] = []

    def make(model: LongMoE | None = None, draft: LongMoE | None = None, **fields) -> Engine:
        if model is None and draft is None:
            e = Engine.from_dir(model_dir, **fields)
        else:
            e = Engine(model if model is not None else tiny_model(), tok, EngineConfig(**fields), draft=draft)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


@pytest.fixture(scope="session")
def vision_dir(tmp_path_factory) -> Path:
    """``tiny_vision_model()`` (``models.VISION`` encoder) saved with its tokenizer."""
    d = tmp_path_factory.mktemp("tiny_vision")
    tiny_vision_model().save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d


def pytest_configure(config) -> None:
    """Tests run torch on one thread: their tensors are tiny, so a second intra-op thread only adds
    synchronisation, and on a shared machine a busy core makes every parallel op wait for it (a test
    that needs more threads sets them itself)."""
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items) -> None:
    """The tiers by rule (``tests/helpers/tiers.py``): integration tests get the ``integration``
    marker (``make test-unit`` deselects them); slow tests that state no wall time are listed for
    ``tests/test_test_tiers.py``, which fails naming them."""
    for item in items:
        if is_integration(item):
            item.add_marker(pytest.mark.integration)
    config.stash[SLOW_WITHOUT_WALL] = [item.nodeid for item in items if missing_wall(item)]
