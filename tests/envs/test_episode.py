"""The shared episode loop (``envs.episode.EpisodeState``): counters, the end by the environment or
by the driver, and the cut-turn rule every driver parses generated text with."""

from __future__ import annotations

from longmoe.data.chat import AssistantTurn, ToolCall
from longmoe.envs import make_env, play
from longmoe.envs.episode import CUT_TURN, EpisodeState, parse_turn


def test_state_follows_the_expert_to_the_same_end_as_play() -> None:
    env = make_env("calculator", horizon=2)
    ep = EpisodeState(env, 3)
    while not ep.done:
        ep.begin_turn()
        ep.step(env.expert(), prompt_tokens=10 * ep.turns, completion_tokens=5)
    ref = play(make_env("calculator", horizon=2), 3)
    assert ep.reward == ref.reward == 1.0 and ep.state_keys == ref.state_keys
    assert ep.turns == len(ref.state_keys) and ep.generated == 5 * ep.turns
    assert ep.tokens == 10 * (ep.turns - 1) + 5
    assert not (ep.malformed or ep.truncated or ep.overflow or ep.stopped)


def test_malformed_turn_ends_with_zero_and_is_counted() -> None:
    ep = EpisodeState(make_env("calculator", horizon=2), 0)
    obs = ep.step(AssistantTurn("x", (ToolCall("nope", {}),)))
    assert obs == [] and ep.done and ep.reward == 0.0
    assert ep.malformed and "unknown tool" in (ep.malformed_reason or "")


def test_driver_stop_is_reward_zero_and_not_malformed() -> None:
    ep = EpisodeState(make_env("doclookup", horizon=2), 0)
    ep.stop(overflow=True)
    assert ep.done and ep.stopped and ep.overflow and not ep.truncated
    assert ep.reward == 0.0 and ep.info == {} and not ep.malformed and ep.malformed_reason is None


def test_cut_turn_is_malformed_whatever_it_says() -> None:
    assert parse_turn("42", cut=True).malformed == CUT_TURN
    assert parse_turn("42").malformed is None and parse_turn("42").is_final
