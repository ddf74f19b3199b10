"""The tool environments: the expert always wins, determinism by seed, malformed and bad calls end
the episode with 0 and are counted, tool errors are observations, knowledge-state keys, configs."""

from __future__ import annotations

import json

import pytest

from longmoe.data.chat import (
    AssistantTurn,
    ToolCall,
    encode_chat,
    parse_assistant,
    render_messages,
    render_tools,
)
from longmoe.envs import (
    ENVS,
    HELD_OUT_SEED_BASE,
    CalculatorEnv,
    DocLookupEnv,
    EnvConfigError,
    env_config,
    make_env,
    play,
)
from longmoe.envs.toolenv import answer_matches, check_arguments
from tests.helpers.tokenizer import tokenizer_for_tests

SMALL = {
    "doclookup": {"page_chars": 120, "pages_per_doc": 2, "distractors": 3},
    "calculator": {},
    "sql": {"distractors": 3},
}


def small_env(name: str, horizon: int = 2, **kw):
    return make_env(name, horizon=horizon, **{**SMALL[name], **kw})


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize("horizon", [1, 3, 8])
def test_expert_always_succeeds(name: str, horizon: int) -> None:
    """Over many training and held-out seeds the scripted expert reaches reward 1 in minimal calls."""
    env = small_env(name, horizon)
    per_step = 2 if name == "doclookup" else 1
    for seed in [*range(40), *range(HELD_OUT_SEED_BASE, HELD_OUT_SEED_BASE + 10)]:
        ep = play(env, seed)
        assert ep.reward == 1.0, (name, horizon, seed, ep.info)
        assert ep.info["success"] and ep.info["malformed"] == 0 and ep.info["tool_errors"] == 0
        assert ep.info["tool_calls"] == per_step * horizon
        assert ep.messages[-1] == {"role": "assistant", "content": env.answer}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_deterministic_by_seed(name: str) -> None:
    a, b = play(small_env(name), 5), play(small_env(name), 5)
    assert a.messages == b.messages and a.state_keys == b.state_keys
    assert play(small_env(name), 6).messages != a.messages
    held = play(small_env(name), HELD_OUT_SEED_BASE + 5).messages
    assert held[1] != a.messages[1]  # held-out seeds draw other tasks


@pytest.mark.parametrize("name", sorted(ENVS))
def test_transcript_renders_and_parses_back(name: str) -> None:
    """The expert's assistant turns render in the chat format and parse back to the same calls."""
    ep = play(small_env(name), 3)
    tok = tokenizer_for_tests()
    ct = encode_chat(tok, ep.messages)
    assert ct.ids == tok.encode(render_messages(ep.messages, add_generation_prompt=False))
    for m in ep.messages:
        if m["role"] != "assistant":
            continue
        body = render_messages([m], add_generation_prompt=False).split("\n", 1)[1]
        turn = parse_assistant(body)
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m.get("tool_calls", [])
        ]
        assert turn.malformed is None
        assert [(c.name, c.arguments) for c in turn.tool_calls] == calls


@pytest.mark.parametrize("name", sorted(ENVS))
@pytest.mark.parametrize(
    ("turn", "reason"),
    [
        (AssistantTurn("", (), "tool call 0: invalid JSON"), "invalid JSON"),
        (AssistantTurn("", (ToolCall("rm", {"path": "/"}),)), "unknown tool"),
    ],
)
def test_malformed_or_unknown_tool_ends_with_zero(name: str, turn: AssistantTurn, reason: str) -> None:
    env = small_env(name)
    env.reset(1)
    res = env.step(turn)
    assert res.done and res.reward == 0.0 and res.messages == []
    assert res.info["malformed"] == 1 and reason in res.info["malformed_reason"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(env.expert())


@pytest.mark.parametrize(
    ("name", "call", "reason"),
    [
        ("calculator", ToolCall("calc", {}), "missing"),
        ("calculator", ToolCall("calc", {"expression": 3}), "type string"),
        ("calculator", ToolCall("calc", {"expression": "1", "x": 1}), "unexpected"),
        ("doclookup", ToolCall("open", {"doc_id": "D1000", "page": "1"}), "type integer"),
        ("doclookup", ToolCall("open", {"doc_id": "D1000", "page": True}), "type integer"),
        ("doclookup", ToolCall("search", {"q": "x"}), "missing"),
    ],
)
def test_bad_arguments_end_with_zero(name: str, call: ToolCall, reason: str) -> None:
    env = small_env(name)
    env.reset(2)
    res = env.step(AssistantTurn("", (call,)))
    assert res.done and res.reward == 0.0 and res.info["malformed"] == 1
    assert reason in res.info["malformed_reason"]


def test_malformed_text_from_a_model_is_handled() -> None:
    """What a model might really write: a broken JSON call parses as malformed and ends the episode."""
    env = small_env("calculator")
    env.reset(0)
    res = env.step(parse_assistant('<|tool_call|>{"name": "calc", "arguments": {"expression": "1+"<|end|>'))
    assert res.done and res.reward == 0.0 and res.info["malformed"] == 1


@pytest.mark.parametrize(
    ("name", "call", "text"),
    [
        ("calculator", ToolCall("calc", {"expression": "1 / 0"}), "error: division by zero"),
        ("calculator", ToolCall("calc", {"expression": "import os"}), "error: syntax error"),
        ("doclookup", ToolCall("open", {"doc_id": "D0000", "page": 1}), "error: there is no document"),
    ],
)
def test_tool_errors_are_observations(name: str, call: ToolCall, text: str) -> None:
    env = small_env(name)
    env.reset(3)
    key = env.state_key()
    res = env.step(AssistantTurn("", (call,)))
    assert not res.done and res.messages[0]["content"].startswith(text)
    assert res.info["tool_errors"] == 1 and res.info["malformed"] == 0
    assert env.state_key() == key  # an error teaches nothing
    while not res.done:  # the expert still wins from here
        res = env.step(env.expert())
    assert res.reward == 1.0 and res.info["tool_errors"] == 1


def test_page_out_of_range_is_an_observation() -> None:
    env = small_env("doclookup")
    env.reset(4)
    doc = env.docs[0]
    res = env.step(AssistantTurn("", (ToolCall("open", {"doc_id": doc.doc_id, "page": 9}),)))
    assert "does not exist" in res.messages[0]["content"] and not res.done


@pytest.mark.parametrize("name", sorted(ENVS))
def test_answer_checking(name: str) -> None:
    env = small_env(name)
    env.reset(8)
    assert env.step(AssistantTurn(f" {env.answer}.\n")).reward == 1.0
    env.reset(8)
    res = env.step(AssistantTurn(env.answer + "0"))
    assert res.done and res.reward == 0.0 and not res.info["success"] and res.info["malformed"] == 0
    assert answer_matches('"42"', "42") and not answer_matches("the answer is 42", "42")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_turn_limit_truncates(name: str) -> None:
    env = small_env(name, max_turns=2)
    env.reset(0)
    useless = {
        "doclookup": ToolCall("search", {"query": "zzz"}),
        "calculator": ToolCall("calc", {"expression": "1"}),
        "sql": ToolCall("sql", {"query": "SELECT 1"}),
    }[name]
    assert not env.step(AssistantTurn("", (useless,))).done
    res = env.step(AssistantTurn("", (useless,)))
    assert res.done and res.reward == 0.0 and res.info["truncated"] and len(res.messages) == 1


def test_several_calls_in_one_turn() -> None:
    """Calls run in order, one tool message each, with the call ids."""
    env = small_env("calculator")
    env.reset(0)
    a, b = ToolCall("calc", {"expression": "1+1"}, "x"), ToolCall("calc", {"expression": "2*3"}, "y")
    res = env.step(AssistantTurn("", (a, b)))
    assert [(m["tool_call_id"], m["content"]) for m in res.messages] == [("x", "2"), ("y", "6")]
    assert res.info["tool_calls"] == 2


def test_state_key_is_knowledge_not_path() -> None:
    """Doclookup: a detour that learns nothing about the chain leaves the key as the expert's."""
    env = small_env("doclookup", horizon=3)
    env.reset(11)
    direct = [env.state_key()]
    env.step(env.expert())
    direct.append(env.state_key())
    env.reset(11)
    env.step(AssistantTurn("", (ToolCall("search", {"query": "nothing-matches-this"}),)))
    assert env.state_key() == direct[0]
    env.step(env.expert())
    assert env.state_key() == direct[1]
    assert direct[0] != direct[1]
    env.reset(12)
    assert env.state_key() != direct[0]  # other tasks never share a key


def test_calculator_state_counts_intermediate_results() -> None:
    env = small_env("calculator", horizon=2)
    env.reset(3)
    v1 = env.values[1]
    env.step(AssistantTurn("", (ToolCall("calc", {"expression": f"{v1} + 0"}),)))  # same result, another way
    other = CalculatorEnv(env.config)
    other.reset(3)
    other.step(other.expert())
    assert env.state_key() == other.state_key() == "calculator:3:1"


def test_calculator_max_start_bounds_the_starting_stock() -> None:
    starts = set()
    for seed in range(40):
        env = make_env("calculator", horizon=3, max_start=30)
        env.reset(seed)
        starts.add(env.values[0])
        assert play(make_env("calculator", horizon=3, max_start=30), seed).reward == 1.0
    assert min(starts) >= 10 and max(starts) <= 30 and len(starts) > 5
    with pytest.raises(EnvConfigError, match="max_start"):
        make_env("calculator", max_start=5)


def test_doclookup_long_trajectories() -> None:
    """Long pages and many hops: the expert's transcript holds horizon pages of page_chars each."""
    env = make_env("doclookup", horizon=16, page_chars=2000, pages_per_doc=3, distractors=8)
    ep = play(env, 0)
    assert ep.reward == 1.0
    chars = sum(len(m["content"]) for m in ep.messages if m["role"] == "tool")
    assert chars > 16 * 1900
    assert isinstance(env, DocLookupEnv) and len(env.docs) == 24


def test_doclookup_search_ranks_the_exact_title_first() -> None:
    env = small_env("doclookup", horizon=4, distractors=20)
    env.reset(0)
    for d in env.docs[:4]:
        assert env.search(d.title)[0] is d
        assert env.search(d.doc_id)[0] is d


def test_configs() -> None:
    assert env_config("doclookup", horizon=16).horizon == 16
    assert make_env("calculator", horizon=5).horizon == 5
    with pytest.raises(EnvConfigError, match="horizon=0"):
        make_env("doclookup", horizon=0)
    with pytest.raises(EnvConfigError, match="page_chars"):
        env_config("doclookup", page_chars=5)
    with pytest.raises(EnvConfigError, match="no config field"):
        env_config("calculator", pages=3)
    with pytest.raises(EnvConfigError, match="unknown"):
        make_env("shell")
    with pytest.raises(EnvConfigError, match="seed"):
        make_env("calculator").reset(-1)
    for name, entry in ENVS.items():
        env = entry.build(entry.config())
        assert env.name == name
        for t in env.tools:
            assert t["type"] == "function" and check_arguments(t, {}) is not None


@pytest.mark.parametrize("name", sorted(ENVS))
def test_opening_messages_render_the_same_with_their_tools(name):
    """An environment's system message carries render_tools' block, so rendering its messages with
    ``tools=env.tools`` (what the server does for a function-calling request) changes nothing."""
    env = make_env(name)
    opening = env.reset(HELD_OUT_SEED_BASE)
    assert opening[0]["content"].endswith(render_tools(env.tools))
    assert render_messages(opening, tools=env.tools) == render_messages(opening)
