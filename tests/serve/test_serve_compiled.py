"""``--compile`` (serve/compiled.py): the decode step compiles once per graph kind (``B == 1``, ``B >= 2``)
and never again as contexts grow and batches change (a recompile is counted and fails here); inductor's
real build gives eager's greedy tokens; a background warm-up serves eagerly until its graphs are ready."""

from __future__ import annotations

import pytest
import torch

from longmoe.serve.compiled import CompiledSteps, cache_dir
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from tests.helpers.models import tiny_model

# one KDA layer (dense FFN) and one MLA layer (MoE FFN): every static-shape path, a quarter of the tracing
SMALL = {"n_layers": 2, "layer_pattern": "LM", "attn_res_blocks": 2}
PROMPTS = ["import os", "class Foo(object):\n    def", "x = [1, 2, 3]\nfor"]
MAX_TOKENS = [70, 40, 12]  # the batch shrinks 3 -> 2 -> 1; contexts cross the 64-token capacity bucket
MORE_PROMPTS = ["def main(argv):\n    return", "while True:", "print('hello, world')", "y = x * 2"]


def _params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(make_engine):
    """``engine(seed=0, **fields)``: the ``SMALL`` tiny model of ``seed``, 16-token prefill chunks."""
    return lambda seed=0, **kw: make_engine(tiny_model(seed, **SMALL), **{"prefill_chunk": 16, **kw})


def _tokens(e: Engine, prompts=PROMPTS, max_tokens=MAX_TOKENS) -> list[list[int]]:
    return [c.token_ids for c in e.generate_batch(prompts, [_params(n) for n in max_tokens])]


def _eager_tokens(engine, seed: int = 0) -> list[list[int]]:
    with engine(seed=seed) as e:
        return _tokens(e)


def _compiled(engine, backend: str, **kw) -> Engine:
    torch._dynamo.reset()
    e = engine(**kw)
    e.compiled = CompiledSteps(e.model, backend=backend)
    return e


def test_steady_decode_never_recompiles(engine):
    """Dynamo capture (eager backend): two decode graphs, then batch sizes 1-4 and contexts past a
    capacity bucket compile nothing again; the counts reach ``Engine.stats()``."""
    e = _compiled(engine, "eager")
    assert _tokens(e) == _eager_tokens(engine)
    _tokens(e, MORE_PROMPTS, (90, 30, 20, 5))
    stats = e.stats()
    e.close()
    assert stats["recompiles"] == 0, stats
    assert stats["compiled_graphs"] == 2 and stats["compile_seconds"] > 0


@pytest.mark.parametrize("quant", [None, "int8"])
def test_batched_decode_compiles_once_for_every_batch_size_1_to_64_on_kimi_shaped_moe(make_engine, quant):
    """Top-4 of 16 experts with a shared expert (Kimi's routing shape): 64 requests whose lengths all
    differ, so the decode batch passes through every size from 64 down to 1. The ``B >= 2`` graph
    compiles once and serves them all with eager's tokens. (It used to guard on N·k <= 64 pairs, so
    B = 17 recompiled into the untraced sorted dispatch, which fullgraph refuses: every request of the
    step ended with ``finish_reason: "error"``, as ``--compile`` serving did at 32 clients.)"""
    from longmoe.config import FFNConfig
    from longmoe.quantize import quantize_model

    ffn = FFNConfig(kind="moe", n_experts=16, top_k=4, n_shared=1, latent_ratio=2, expert_hidden=32)
    kimi = {**SMALL, "ffn": ffn}
    n = 64
    prompts = [f"x{i} = {i}" for i in range(n)]
    lengths = [80 + i for i in range(n)]  # all admitted before the first finishes, then one leaves a step

    def kimi_engine() -> Engine:
        m = tiny_model(0, **kimi)
        if quant:
            quantize_model(m, quant)
        return make_engine(m, prefill_chunk=16, max_batch=n)

    with kimi_engine() as ref:
        want = _tokens(ref, prompts, lengths)
    torch._dynamo.reset()
    e = kimi_engine()
    e.compiled = CompiledSteps(e.model, backend="eager")
    seen: set[int] = set()
    run = e.compiled._run

    def spy(kind, x, cache):
        seen.add(x.shape[0])
        return run(kind, x, cache)

    e.compiled._run = spy
    got = _tokens(e, prompts, lengths)
    stats = e.stats()
    e.close()
    assert seen == set(range(1, n + 1))
    assert got == want
    assert stats["recompiles"] == 0 and stats["compiled_graphs"] == 2, stats


def test_capacity_buckets_between_powers_of_two_never_recompile(engine):
    """A context growing from ~950 past 1024 tokens moves through the 1/16-octave buckets (960 ... 1152): the
    capacity is symbolic, so no bucket compiles again, and the tokens are eager's."""
    prompt = ["x = 1\n" * 190]
    e = _compiled(
        engine, "eager", max_context=2048
    )  # past the model's window: NoPE + KDA have no position limit
    got = _tokens(e, prompt, [200])
    stats = e.stats()
    e.close()
    with engine(max_context=2048) as ref:
        assert got == _tokens(ref, prompt, [200])
    assert stats["recompiles"] == 0, stats


def test_background_warmup_serves_eagerly_then_compiled(engine):
    """Requests right after the engine starts run eagerly while the warm-up compiles, with the same
    tokens; afterwards both graphs are ready and nothing compiles again."""
    want = _eager_tokens(engine)
    e = _compiled(engine, "eager")
    e.compiled.warmup(background=True)
    assert _tokens(e) == want
    e.compiled.join()
    assert e.compiled.ready(1) and e.compiled.ready(3)
    assert _tokens(e) == want
    assert e.stats()["recompiles"] == 0 and e.stats()["compile_warming_up"] == 0
    e.close()


@pytest.mark.slow(wall="not measured; an inductor compile, minutes on 2 cores")
def test_inductor_decode_tokens_identical(engine):
    """The real path as ``--compile`` runs it (inductor's C++ build in a background warm-up, on-disk
    cache in ``cache_dir()``): eager's greedy tokens while it compiles and after. Slow: 51-204 s with an
    empty cache on this shared 2-core machine, by its load (11-42 s warm)."""
    want = _eager_tokens(engine)
    torch._dynamo.reset()
    e = engine(compile=True)
    assert e.compiled is not None and e.compiled.backend == "inductor"
    assert _tokens(e) == want
    e.compiled.join()
    assert e.compiled.ready(1) and e.compiled.ready(2)
    assert _tokens(e) == want
    assert e.stats()["recompiles"] == 0
    assert e.compiled.cache_path is not None and e.compiled.cache_path == cache_dir()
    e.close()
    # a second engine, on other weights of the same shapes, loads both steps saved above (weights are
    # the steps' inputs, not constants): nothing traced or compiled, and that model's eager tokens
    other = engine(seed=1, compile=True)
    other.compiled.join()
    assert other.stats()["precompiled_loads"] == 2
    assert _tokens(other) == _eager_tokens(engine, seed=1)
    assert other.stats()["recompiles"] == 0
    other.close()


class _FailingGuards:
    """A precompiled step whose guards reject every call (as one compiled for other inputs would)."""

    def guard_check(self, *args) -> bool:
        return False


def test_precompiled_step_failing_guards_falls_back_to_compiling(engine):
    """A loaded step that does not fit the call is dropped, counted as a recompile, logged, and the step
    compiles in-process: the same tokens, no exception."""
    e = _compiled(engine, "eager")
    e.compiled._steps[CompiledSteps.kind(1)] = _FailingGuards()
    e.compiled.compiles[CompiledSteps.kind(1)] = 0.0
    got = _tokens(e, PROMPTS[:1], MAX_TOKENS[:1])
    stats = e.stats()
    e.close()
    assert got == _eager_tokens(engine)[:1]
    assert stats["recompiles"] == 1 and CompiledSteps.kind(1) not in e.compiled._steps
