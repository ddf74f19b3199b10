"""The data-analysis environment: the expert always wins, every hop needs the previous result,
voids (the later correction) change the answer when ignored, and the knowledge state."""

from __future__ import annotations

import re

import pytest

from longmoe.data.chat import AssistantTurn, ToolCall
from longmoe.envs import HELD_OUT_SEED_BASE, EnvConfigError, SQLEnv, make_env, play
from longmoe.envs.sql import EXPERT_SQL


@pytest.mark.parametrize("horizon", [1, 2, 8, 16, 32])
@pytest.mark.parametrize("corrections", [0, 1])
def test_expert_always_succeeds(horizon: int, corrections: int) -> None:
    """Over many training and held-out seeds: one query per hop, then the answer."""
    seeds = [*range(30), *range(HELD_OUT_SEED_BASE, HELD_OUT_SEED_BASE + 10)]
    for seed in seeds if horizon <= 8 else seeds[::4]:
        ep = play(make_env("sql", horizon=horizon, corrections=corrections, distractors=6), seed)
        assert ep.reward == 1.0, (horizon, seed, ep.info)
        assert ep.info["tool_calls"] == horizon and ep.info["tool_errors"] == 0
        assert [int(k.rsplit(":", 1)[1]) for k in ep.state_keys] == list(range(horizon + 1))


def _naive_play(env: SQLEnv, seed: int, with_voids: bool) -> bool:
    """Follow leaders hop by hop from the tool's own answers (no ground truth): the next city is the
    top row's partner; stop at NULL and answer the gap between the two rows."""
    env.reset(seed)
    city = re.search(r"Start in the city (\S+)\.", env.reset(seed)[1]["content"]).group(1)
    sql = (
        EXPERT_SQL
        if with_voids
        else EXPERT_SQL.replace(" AND o.order_id NOT IN (SELECT order_id FROM voids)", "")
    )
    for _ in range(env.horizon + 5):
        res = env.step(AssistantTurn("", (ToolCall("sql", {"query": sql.format(city=city)}),)))
        rows = [r.split(",") for r in res.messages[0]["content"].split("\n")[1:]]
        if rows[0][1] == "NULL":
            return env.step(AssistantTurn(str(int(rows[0][2]) - int(rows[1][2])))).reward == 1.0
        city = rows[0][1]
    return False


def test_each_hop_needs_the_previous_result_and_the_voids() -> None:
    """A policy reading only the tool's results wins with the voids excluded, and loses on every
    task with a correction when it ignores them (the corrected city's raw leader is another store)."""
    for seed in range(20):
        env = make_env("sql", horizon=4, corrections=1, distractors=6)
        assert isinstance(env, SQLEnv)
        assert _naive_play(env, seed, with_voids=True)
        assert not _naive_play(env, seed, with_voids=False)
        clean = make_env("sql", horizon=4, distractors=6)
        assert _naive_play(clean, seed, with_voids=False)  # no correction: voids change nothing


def test_state_key_is_knowledge_not_path() -> None:
    env = make_env("sql", horizon=3)
    env.reset(5)
    assert env.state_key() == "sql:5:0"
    env.step(AssistantTurn("", (ToolCall("sql", {"query": "SELECT * FROM stores"}),)))
    assert env.state_key() == "sql:5:0"  # listing stores does not reveal a leader's revenue
    env.step(AssistantTurn("", (ToolCall("sql", {"query": "SELECT nonsense"}),)))
    assert env.state_key() == "sql:5:0"
    env.step(env.expert())
    assert env.state_key() == "sql:5:1"


def test_sandbox_refusals_are_tool_errors() -> None:
    env = make_env("sql", horizon=2)
    env.reset(1)
    for q in ("DROP TABLE orders", "ATTACH ':memory:' AS x", "PRAGMA table_info(orders)"):
        res = env.step(AssistantTurn("", (ToolCall("sql", {"query": q}),)))
        assert not res.done and res.messages[0]["content"].startswith("error: ")
    while not res.done:
        res = env.step(env.expert())
    assert res.reward == 1.0 and res.info["tool_errors"] == 3


def test_results_are_capped_as_stated() -> None:
    env = make_env("sql", horizon=2, distractors=40, max_rows=10, max_result_chars=300)
    env.reset(0)
    res = env.step(AssistantTurn("", (ToolCall("sql", {"query": "SELECT * FROM orders"}),)))
    out = res.messages[0]["content"]
    assert len(out) <= 300 and "[truncated: showing" in out


def test_config_ranges() -> None:
    with pytest.raises(EnvConfigError, match="corrections"):
        make_env("sql", horizon=2, corrections=3)
    with pytest.raises(EnvConfigError, match="horizon"):
        make_env("sql", horizon=33)
    with pytest.raises(EnvConfigError, match="max_result_chars"):
        make_env("sql", max_result_chars=10)
