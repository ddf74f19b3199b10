"""Rollouts: the trajectory layout (policy mask on exactly the sampled turns, observations masked),
rollout logprobs equal a teacher-forced forward of the whole trajectory, sessions and full
resubmission give the same trajectories, seeds make them reproducible, truncation."""

from __future__ import annotations

import threading

import pytest
import torch

from longmoe.agent.rollout import RolloutConfig, collect
from longmoe.serve.sampling import SamplingParams
from tests.helpers.agent import FakeEnv

CFG = RolloutConfig(group_size=3, max_turn_tokens=12, max_episode_tokens=512, seed=5)


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(prefill_chunk=32, max_batch=16)


def test_layout_and_masks(engine):
    trajs = collect(engine, lambda i: FakeEnv(), [11, 12], CFG)
    assert [(t.task, t.sample) for t in trajs] == [(i, g) for i in range(2) for g in range(3)]
    end = engine.tokenizer.end_id
    for t in trajs:
        assert len(t.ids) == len(t.policy_mask) == len(t.logprobs)
        assert len(t.turns) == 3 and [u.state_key for u in t.turns] == ["t0", "t1", "t2"]
        spans = set()
        for u in t.turns:
            assert u.end > u.start
            spans |= set(range(u.start, u.end))
            assert t.ids[u.end - 1] == end or u.end - u.start == CFG.max_turn_tokens
            assert (u.malformed is not None) == (t.ids[u.end - 1] != end)
        assert spans == {i for i, m in enumerate(t.policy_mask) if m}  # observations are masked
        assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.policy_mask) if not m)
        assert all(lp < 0.0 for lp, m in zip(t.logprobs, t.policy_mask) if m)
        assert t.turns[1].cached > 0 and t.turns[2].cached > t.turns[1].cached  # kept across turns


def test_rollout_logprobs_match_teacher_forcing(engine):
    (t,) = collect(engine, lambda i: FakeEnv(), [3], RolloutConfig(group_size=1, max_turn_tokens=12, seed=1))
    with torch.no_grad():
        logits = engine.model(torch.tensor([t.ids])).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(t.ids[1:])[:, None])[:, 0]
    mask = torch.tensor(t.policy_mask[1:])
    got = torch.tensor(t.logprobs[1:])
    assert torch.allclose(lp[mask], got[mask], atol=2e-3)


def test_sessions_equal_resubmission_and_reproducible(make_engine, engine):
    a = collect(engine, lambda i: FakeEnv(), [7, 8], CFG)
    b = collect(engine, lambda i: FakeEnv(), [7, 8], CFG)
    with make_engine(prefill_chunk=32, prefix_cache=False) as plain:
        c = collect(plain, lambda i: FakeEnv(), [7, 8], RolloutConfig(**{**CFG.__dict__, "sessions": False}))
    assert [t.ids for t in a] == [t.ids for t in b] == [t.ids for t in c]
    assert [t.reward for t in a] == [t.reward for t in c]
    assert all(u.cached == 0 for t in c for u in t.turns)
    assert len({tuple(t.ids) for t in a}) > 1  # the group's samples differ


def test_episode_truncated_at_the_token_limit(engine):
    cfg = RolloutConfig(group_size=2, max_turn_tokens=12, max_episode_tokens=70, seed=2)
    trajs = collect(engine, lambda i: FakeEnv(turns=50), [1], cfg)
    for t in trajs:
        assert t.truncated and t.reward == 0.0 and len(t.ids) <= 70
    engine.generate([5], SamplingParams(max_tokens=1))  # a step that processes the session closes
    assert engine.stats()["sessions_idle"] == 0 and engine.budget.reserved_bytes == 0


def test_rollouts_run_their_steps_in_the_collecting_thread(make_engine):
    """``collect`` drives the engine from its own thread (the one that trains): no engine thread starts,
    and a second engine that already runs one still serves it (the caller then only waits)."""
    with make_engine(prefill_chunk=32, max_batch=16) as e:
        trajs = collect(e, lambda i: FakeEnv(), [11], CFG)
        assert e._thread is None and len(trajs) == CFG.group_size
    with make_engine(prefill_chunk=32, max_batch=16) as e:
        done = threading.Event()
        e.submit("x", SamplingParams(max_tokens=2), sink=lambda ev: ev.done and done.set())  # starts it
        assert done.wait(60) and e._thread is not None
        assert [t.ids for t in collect(e, lambda i: FakeEnv(), [11], CFG)] == [t.ids for t in trajs]
