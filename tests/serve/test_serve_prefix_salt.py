"""Prefix snapshots scoped by ``cache_salt`` (``Engine.submit``): the same prompt reuses its snapshot
only under the same salt (another salt, or none, sees 0 cached tokens), and ``forget_prefix`` drops
exactly the snapshots stored under one salt."""

from __future__ import annotations

from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams

BS = 16
ONE = SamplingParams(max_tokens=1, temperature=0.0)


def cached(engine: Engine, prompt: str, salt: bytes | None) -> int:
    return engine.submit(prompt, ONE, cache_salt=salt).result().cached_tokens


def test_snapshots_are_shared_only_under_the_same_salt(make_engine):
    with make_engine(prefill_chunk=BS, prefix_block_size=BS) as e:
        prompt = " ".join(f"line {i} of the shared report" for i in range(20))
        assert cached(e, prompt, b"alice") == 0
        assert cached(e, prompt, b"alice") > 3 * BS  # the same tenant reuses it
        assert cached(e, prompt, b"bob") == 0  # another tenant learns nothing
        assert cached(e, prompt, None) == 0
        assert cached(e, prompt, None) > 3 * BS
        n = e.stats()["prefix_snapshots"]
        assert e.forget_prefix(b"alice") >= 1
        assert 0 < e.stats()["prefix_snapshots"] < n  # bob's and the unsalted ones stay
        assert cached(e, prompt, b"alice") == 0
        assert cached(e, prompt, b"bob") > 3 * BS
        assert cached(e, prompt, None) > 3 * BS
