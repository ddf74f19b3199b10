"""Horizon-32 episodes end to end: through the engine with sessions (the state kept between turns:
each turn prefills only its observation, never the transcript again; the same tokens as
resubmitting the whole trajectory) and through longmoe's HTTP server with tools (a function-calling
client, 33 requests of a growing conversation). Calculator episodes with corrections and
distractors (about 3K tokens) keep these CPU tests short; ``bench/rollout_long.py`` runs 30K-token
doclookup episodes. The tiny model is untrained, so the environment is
driven by its expert (``envs.forced``); observations are the real ones."""

from __future__ import annotations

import pytest
import torch

from longmoe.agent.rollout import RolloutConfig, collect
from longmoe.data.chat import AssistantTurn, ToolCall
from longmoe.envs import make_env
from longmoe.envs.forced import ExpertForced
from longmoe.eval.agent.harness import run_episode
from longmoe.eval.agent.policies import EndpointAgent, ExpertForcedAgent
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.api import create_app
from tests.helpers.server import serving, wait_idle

H = 32
CTX = 16_384


def _long_env():
    return ExpertForced(make_env("calculator", horizon=H, distractors=4, corrections=2))


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, n_layers=4, max_seq_len=CTX)
    return LongMoE(cfg).eval()


@pytest.fixture(scope="module")
def engine(model, make_engine):
    """``engine(**fields)``: an engine over the module's model with a ``CTX`` context."""
    return lambda **kw: make_engine(model, **{"max_context": CTX, "prefill_chunk": 512, "max_batch": 8, **kw})


def test_expert_forced_env_plays_the_expert_whatever_the_turn() -> None:
    env = ExpertForced(make_env("sql", horizon=3))
    env.reset(4)
    res = None
    for _ in range(4):
        res = env.step(AssistantTurn("garbage", (ToolCall("x", {}, "mine"),)))
    assert res is not None and res.done and res.reward == 1.0 and res.info["tool_calls"] == 3
    assert env.state_key() == "sql:4:3"


@pytest.mark.slow(wall="not measured (a 32-turn episode through the engine)")
def test_horizon_32_through_the_engine_with_sessions(engine) -> None:
    cfg = RolloutConfig(group_size=1, max_turn_tokens=8, max_episode_tokens=CTX - 1, seed=3)
    with torch.inference_mode():
        with engine() as e:
            kept = collect(e, lambda i: _long_env(), [7], cfg)
            stats = e.stats()
        with engine(prefix_cache=False) as e:
            again = collect(
                e, lambda i: _long_env(), [7], RolloutConfig(**{**cfg.__dict__, "sessions": False})
            )
    for t in kept:
        assert len(t.turns) == H + 1 and t.success and not t.truncated and len(t.ids) > 2000
        for u, prev in zip(t.turns[1:], t.turns, strict=False):
            # a turn prefills only what came after the previous turn's end: its observation (+1: the
            # last sampled token, fed one step after it was chosen), never the transcript again
            assert u.prefilled <= u.start - prev.end + 1 and u.cached >= prev.end - 1
    assert [t.ids for t in kept] == [t.ids for t in again]  # the same tokens as resubmitting
    resubmitted = sum(u.prefilled for t in again for u in t.turns)
    assert resubmitted > 10 * sum(u.prefilled for t in kept for u in t.turns)
    assert stats["session_turns"] >= H


@pytest.mark.slow(wall="not measured (33 requests through the HTTP server)")
def test_horizon_32_through_the_http_server_with_tools(engine) -> None:
    """33 function-calling requests of a growing conversation with tool messages: the server
    answers every one; the conversation's prompt grows by each observation."""
    with engine() as e, serving(create_app(e, model_name="tiny")) as url:
        agent = ExpertForcedAgent(EndpointAgent(f"{url}/v1", "tiny", timeout=120))
        env = make_env("calculator", horizon=H, distractors=4, corrections=2)
        r = run_episode(agent, env, 11, max_tokens=4)
        wait_idle(e)
    assert r.success and r.turns == H + 1 and r.tool_calls == H
    prompts = [x.prompt_tokens for x in agent.replies]
    assert len(prompts) == r.turns and all(b > a for a, b in zip(prompts, prompts[1:], strict=False))
    assert prompts[-1] > 2000
