"""Sessions: multi-turn requests continue a kept cache row (only new tokens are prefilled) and give the
same tokens as a fresh request with the whole conversation; many concurrent sessions; budget
accounting, eviction of idle rows (the next turn re-prefills, same output), close, misuse errors."""

from __future__ import annotations

import random
import threading

import pytest

from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.session import SessionError
from tests.helpers.models import VOCAB

GREEDY = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


@pytest.fixture(scope="module")
def fresh(make_engine):
    return make_engine(prefill_chunk=16, prefix_cache=False)


def run_episode(e: Engine, fresh: Engine, seed: int, turns: int, params: SamplingParams) -> None:
    """Turns on one session; each turn's output equals a fresh full-context request's."""
    s = e.open_session()
    context: list[int] = []
    for t in range(turns):
        new = ids(5 + 11 * t, 100 * seed + t)  # the observation (longer than a chunk later on)
        got = e.generate(new, params, session=s)
        context += new
        want = fresh.generate(context, params)
        assert got.token_ids == want.token_ids, (seed, t)
        if params.logprobs:
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        assert got.prompt_tokens == len(context)
        assert got.cached_tokens == (len(context) - len(new) - 1 if t else 0)  # all but the new tokens
        context += got.token_ids
        assert s.tokens == context
    e.close_session(s)


def test_session_turns_equal_fresh_full_prefill(make_engine, fresh):
    with make_engine(prefill_chunk=16, prefix_cache=False) as e:
        run_episode(e, fresh, 0, 5, GREEDY)
        sampled = SamplingParams(max_tokens=6, temperature=0.9, seed=3, ignore_eos=True, logprobs=True)
        run_episode(e, fresh, 1, 4, sampled)
        st = e.stats()
    assert st["session_turns"] == 9 and st["session_tokens_reused"] > 0
    assert st["session_evictions"] == 0


def test_many_concurrent_sessions(make_engine, fresh):
    with make_engine(prefill_chunk=32, max_batch=8) as e:  # prefix reuse on as well
        errors: list[BaseException] = []

        def episode(seed: int) -> None:
            try:
                run_episode(e, fresh, seed, 3, GREEDY)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=episode, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors[0]
        assert e.stats()["session_turns"] == 24
        e.close_session(e.open_session())
        e.generate([5], SamplingParams(max_tokens=1))  # one step processes the closes
        assert e.budget.reserved_bytes == 0 and not e.sessions.idle


def test_idle_row_is_reserved_at_its_length_and_released_on_close(make_engine):
    with make_engine(prefill_chunk=16) as e:
        s = e.open_session()
        out = e.generate(ids(20, 1), GREEDY, session=s)
        e.generate([5], SamplingParams(max_tokens=1))  # a later step: the row is kept
        n = 20 + len(out.token_ids) - 1
        assert s.cached == n and e.budget.reserved[s.key] == e.budget.spec.bytes_for(n, e.budget.block_size)
        assert e.stats()["sessions_idle"] == 1
        e.close_session(s)
        e.generate([5], SamplingParams(max_tokens=1))
        assert e.budget.reserved_bytes == 0 and s.cache is None
        with pytest.raises(SessionError, match="closed"):
            e.submit([1], GREEDY, session=s)


def test_eviction_under_pressure_keeps_outputs(make_engine, fresh):
    with make_engine(prefill_chunk=16) as probe:
        need = probe.budget.spec.bytes_for(120, probe.budget.block_size)
    with make_engine(prefill_chunk=16, cache_budget_bytes=need, prefix_cache=False) as e:
        a, b = e.open_session(), e.open_session()
        ctx_a = ids(30, 1)
        ctx_a += e.generate(ctx_a, GREEDY, session=a).token_ids
        e.generate(ids(90, 2), GREEDY, session=b)  # needs a's room: a's idle row is evicted
        assert e.stats()["session_evictions"] >= 1 and a.cache is None
        new = ids(8, 3)
        got = e.generate(new, GREEDY, session=a)  # re-prefills a's whole context, same tokens
        assert got.cached_tokens == 0
        assert got.token_ids == fresh.generate(ctx_a + new, GREEDY).token_ids


def test_one_request_at_a_time(make_engine):
    with make_engine(prefill_chunk=16) as e:
        s = e.open_session()
        h = e.submit(ids(10, 1), SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True), session=s)
        with pytest.raises(SessionError, match="in flight"):
            e.submit([1, 2], GREEDY, session=s)
        h.result()
        e.generate([1, 2], GREEDY, session=s)  # fine once the first has finished


def test_close_while_in_flight_drops_the_row_when_it_finishes(make_engine):
    with make_engine(prefill_chunk=16) as e:
        s = e.open_session()
        h = e.submit(ids(10, 1), SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True), session=s)
        e.close_session(s)
        assert len(h.result().token_ids) == 12  # the running request completes
        e.generate([5], SamplingParams(max_tokens=1))
        assert s.cache is None and not e.sessions.idle and e.budget.reserved_bytes == 0
