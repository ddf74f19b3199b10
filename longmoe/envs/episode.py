"""Playing an episode: a policy's turns against an environment, as an OpenAI-style transcript.

``play(env, seed)`` runs the scripted expert (or any ``policy(env) -> AssistantTurn``) to the end
and returns the messages (opening, assistant turns with their ``tool_calls``, tool results), the
reward, the final ``info`` and the knowledge state before each assistant turn. SFT renders the
expert's transcripts with ``data.chat.encode_chat`` (loss on the assistant turns only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from longmoe.data.chat import AssistantTurn
from longmoe.envs.base import Env, Message

Policy = Callable[[Env], AssistantTurn]


@dataclass
class Episode:
    """One finished episode: ``messages`` is the whole transcript; ``state_keys[t]`` the knowledge
    state before assistant turn ``t``."""

    messages: list[Message]
    reward: float
    info: dict[str, Any]
    state_keys: list[str] = field(default_factory=list)


def with_call_ids(turn: AssistantTurn, first: int) -> AssistantTurn:
    """``turn`` with ids ``call_{first}``, ``call_{first + 1}``, ... on calls that have none."""
    calls = tuple(c if c.id else replace(c, id=f"call_{first + i}") for i, c in enumerate(turn.tool_calls))
    return replace(turn, tool_calls=calls)


def assistant_message(turn: AssistantTurn) -> Message:
    """The OpenAI-style assistant message of a turn (``tool_calls`` only when it calls tools)."""
    msg: Message = {"role": "assistant", "content": turn.content}
    if turn.tool_calls:
        msg["tool_calls"] = [c.to_openai(c.id or f"call_{i}") for i, c in enumerate(turn.tool_calls)]
    return msg


def expert_policy(env: Env) -> AssistantTurn:
    return env.expert()


def play(env: Env, seed: int, policy: Policy = expert_policy, max_turns: int = 10_000) -> Episode:
    """Run ``policy`` on the task ``seed`` until the episode ends (the env's own turn limit applies)."""
    messages = env.reset(seed)
    keys: list[str] = []
    n_calls = 0
    for _ in range(max_turns):
        keys.append(env.state_key())
        turn = with_call_ids(policy(env), n_calls + 1)
        n_calls += len(turn.tool_calls)
        messages.append(assistant_message(turn))
        res = env.step(turn)
        messages += res.messages
        if res.done:
            return Episode(messages, res.reward, res.info, keys)
    raise RuntimeError(f"episode did not end within {max_turns} turns")
