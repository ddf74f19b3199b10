"""Long horizons in every environment: the expert wins at horizons 8, 16 and 32 with distractors
and corrections, a doclookup expert transcript reaches 10K-50K tokens, tool results are cut to a
stated size, and reading order matters (a later revision corrects an earlier note)."""

from __future__ import annotations

import re

import pytest

from longmoe.data.chat import AssistantTurn, ToolCall, encode_chat
from longmoe.envs import DocLookupEnv, EnvConfigError, make_env, play
from tests.helpers.tokenizer import tokenizer_for_tests

LONG = {
    "doclookup": {"page_chars": 300, "distractors": 12, "corrections": 3},
    "calculator": {"distractors": 6, "corrections": 3},
    "sql": {"distractors": 12, "corrections": 3},
}


@pytest.mark.parametrize("name", sorted(LONG))
@pytest.mark.parametrize("horizon", [8, 16, 32])
def test_expert_wins_long_horizons_with_distractors_and_corrections(name: str, horizon: int) -> None:
    for seed in range(6):
        ep = play(make_env(name, horizon=horizon, **LONG[name]), seed)
        assert ep.reward == 1.0, (name, horizon, seed, ep.info)
        assert ep.info["tool_calls"] >= horizon


def test_doclookup_expert_transcript_is_tens_of_thousands_of_tokens() -> None:
    """Horizon 32 with 3,000-character pages: the expert's episode is 10K-50K tokens."""
    env = make_env("doclookup", horizon=32, page_chars=3000, distractors=16, corrections=4)
    ep = play(env, 0)
    assert ep.reward == 1.0
    n = len(encode_chat(tokenizer_for_tests(), ep.messages).ids)
    assert 10_000 <= n <= 50_000 * 4, n  # the test tokenizer is coarser than a trained BPE
    chars = sum(len(m["content"]) for m in ep.messages if m["role"] == "tool")
    assert chars > 32 * 2900


def _first_note_policy(env: DocLookupEnv, seed: int) -> bool:
    """Search each record, open only the first listed document of that title, follow its note."""
    title = re.search(r"record (\S+)\.", env.reset(seed)[1]["content"]).group(1)
    for _ in range(4 * env.horizon):
        hits = env.step(AssistantTurn("", (ToolCall("search", {"query": title}),))).messages[0]["content"]
        line = next(h for h in hits.split("\n") if h.split()[1] == title)
        doc_id, page = line.split()[0], int(re.search(r"note on page (\d+)", line).group(1))
        text = env.step(AssistantTurn("", (ToolCall("open", {"doc_id": doc_id, "page": page}),))).messages[0][
            "content"
        ]
        code = re.search(r"access code (\d+)", text)
        if code:
            return env.step(AssistantTurn(code.group(1))).reward == 1.0
        title = re.search(r"refers onward to the record (\S+?)\.", text).group(1)
    return False


def test_doclookup_reading_order_matters() -> None:
    """With every record corrected, acting on the first note read loses on most tasks (whenever a
    revision-1 note comes first in the listing); without corrections the same policy always wins."""
    wins = [
        _first_note_policy(make_env("doclookup", horizon=4, corrections=4, distractors=4), s)
        for s in range(30)
    ]
    assert sum(wins) < 10
    assert all(_first_note_policy(make_env("doclookup", horizon=4, distractors=4), s) for s in range(30))


def test_calculator_corrections_change_the_answer() -> None:
    """A corrected step states a wrong number first; computing with it misses the right count, and
    the expert computes with the corrected one."""
    apply = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__, "//": int.__floordiv__}
    misses = 0
    for seed in range(20):
        env = make_env("calculator", horizon=4, corrections=2, distractors=2)
        question = env.reset(seed)[1]["content"]
        fixes = re.findall(r"Correction: in step (\d) the number is (\d+), not (\d+)\.", question)
        assert len(fixes) == 2 and question.count("Meanwhile") == 2
        for k, right, wrong in fixes:
            step = re.search(rf"\({k}\) ([^(]*)", question).group(1)
            assert re.search(rf"\b{wrong}\b", step) and int(right) == env.ops[int(k) - 1][1]
        naive = env.values[0]
        wrong_of = {int(k) - 1: int(w) for k, _, w in fixes}
        for i, (op, n) in enumerate(env.ops):
            naive = apply[op](naive, wrong_of.get(i, n))
        misses += str(naive) != env.answer  # a wrong divisor can round to the same count: rare
        assert play(make_env("calculator", horizon=4, corrections=2, distractors=2), seed).reward == 1.0
    assert misses >= 18


def test_doclookup_results_are_cut_to_the_stated_size_keeping_the_note() -> None:
    env = make_env("doclookup", horizon=8, page_chars=5000, max_result_chars=1200, distractors=4)
    ep = play(env, 2)
    assert ep.reward == 1.0
    pages = [m["content"] for m in ep.messages if m["role"] == "tool" and m["content"].startswith("[D")]
    assert pages and all(len(p) <= 1200 and "[truncated: showing" in p for p in pages)
    assert all("Registry note" in p for p in pages)
    with pytest.raises(EnvConfigError, match="max_result_chars"):
        make_env("doclookup", max_result_chars=100)
    with pytest.raises(EnvConfigError, match="distractors"):
        make_env("doclookup", corrections=1, distractors=0)


def test_default_tasks_are_unchanged_by_the_new_options() -> None:
    """corrections=0, distractors=0 and no cap draw exactly the tasks drawn before these options."""
    a = play(make_env("doclookup", horizon=2, page_chars=240), 3)
    assert a.reward == 1.0 and a.messages[-1]["content"] == "355831"  # docs/agent.md's example
