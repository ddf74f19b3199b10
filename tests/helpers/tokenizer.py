"""The tokenizer the tests share: small, trained in about a second, cached per process."""

from __future__ import annotations

import functools
import itertools

from longmoe.data.corpus import stdlib_documents
from longmoe.data.tokenizer import Tokenizer


@functools.lru_cache(maxsize=4)
def tokenizer_for_tests(vocab_size: int = 512, n_docs: int = 60) -> Tokenizer:
    """A small tokenizer trained once per process on a slice of the standard-library corpus (~1 s)."""
    texts = (d.text for d in itertools.islice(stdlib_documents("train", "file"), n_docs))
    return Tokenizer.train(texts, vocab_size=vocab_size)
