"""Long contexts through the model: a decode step's host work (Python calls, Python allocations) does not
grow with the cached length, and a chunked prefill of a long prompt equals the uncached forward."""

from __future__ import annotations

import sys
import tracemalloc

import torch

from bench.long_context import synth_cache
from tests.helpers.models import tiny_model

K = 1024


def host_work(model, cache, x) -> tuple[int, int]:
    """``(Python-level calls incl. C functions, peak bytes of Python allocations)`` of one decode step."""
    calls = 0

    def count(frame, event, arg):  # noqa: ANN001, ARG001
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    tracemalloc.start()
    sys.setprofile(count)
    try:
        model(x, cache=cache, logits_to_keep=1)
    finally:
        sys.setprofile(None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return calls, peak


@torch.inference_mode()
def test_decode_step_host_work_is_the_same_at_4k_and_64k():
    """The same Python calls (exactly) and peak Python allocation (within 1 KiB) per decode step
    at 4K and 64K cached tokens: what grows with the context is the kernels' work, never the host's.
    (The MLA rows are read in pieces, but the pieces are one kernel call: their count is a tensor
    dimension, not a Python loop.)"""
    model = tiny_model(max_seq_len=128 * K)
    x = torch.tensor([[7]])
    work = {}
    for n in (4 * K, 64 * K):
        cache = synth_cache(model, n, room=16, seed=n)
        model(x, cache=cache, logits_to_keep=1)  # warm-up (first-call caches, lazy imports)
        work[n] = [host_work(model, cache, x) for _ in range(5)]
    calls = {n: {c for c, _ in w} for n, w in work.items()}
    assert calls[4 * K] == calls[64 * K] and len(calls[4 * K]) == 1, calls  # exactly the same calls
    peaks = {n: [a for _, a in w] for n, w in work.items()}
    assert abs(min(peaks[64 * K]) - min(peaks[4 * K])) <= 1024, peaks


@torch.inference_mode()
def test_long_chunked_prefill_equals_uncached_forward():
    """A 12K-token prompt fed in 4,096-token chunks (the absorbed path, after up to 8K cached rows)
    gives the uncached forward's last logits."""
    model = tiny_model(max_seq_len=16 * K)
    ids = torch.randint(3, 500, (1, 12 * K), generator=torch.Generator().manual_seed(0))
    full = model(ids, logits_to_keep=1).logits[:, -1]
    cache = model.new_cache(1)
    for a in range(0, ids.shape[1], 4 * K):
        out = model(ids[:, a : a + 4 * K], cache=cache, logits_to_keep=1).logits[:, -1]
    assert (out - full).abs().max() < 1e-3


def test_a_long_prompt_run_alone_keeps_the_other_lengths_rows_and_their_provenance():
    """`bench.long_context http --lengths 1048576 --rounds 1` adds a row; the 4K/16K rounds measured in an
    earlier run stay, stamped with that run's commit, and the new row carries its own."""
    from bench.long_context_base import merge_rows

    old = {"provenance": {"commit": "old"}, "rows": {"4096": {"n": 3}, "16384": {"n": 3}}}
    rows = merge_rows(old, {1048576: {"n": 1}, 4096: {"n": 1}}, [1048576, 4096], {"commit": "new"})
    assert [int(k) for k in rows] == [4096, 16384, 1048576]
    assert {int(k): (r["n"], r["provenance"]["commit"]) for k, r in rows.items()} == {
        4096: (1, "new"),
        16384: (3, "old"),
        1048576: (1, "new"),
    }
