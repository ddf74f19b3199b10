"""The bounded load test (bench/load.py) at 32 concurrent streaming clients, short outputs:
no errors, every stream ends with [DONE], every output equals its solo greedy output."""

from __future__ import annotations

from bench.load import run


def test_32_concurrent_streams_equal_solo(model_dir):
    r = run(clients=32, max_tokens=6, model=str(model_dir), timeout_s=120)
    assert r["errors"] == []
    assert r["mismatches"] == []
    assert (r["running_after"], r["cache_bytes_after"]) == (0, 0)
