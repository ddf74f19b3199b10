"""Playing an episode: the one turn loop every driver shares, and the scripted-expert transcript.

``EpisodeState`` is an episode in progress, advanced a turn at a time by whoever holds the policy:
``reset`` → (``begin_turn``: the knowledge state before the turn) → the policy's assistant turn,
parsed (``parse_turn`` for generated text: a turn cut by the token limit is malformed) → ``step``:
the environment steps on it (a malformed turn ends the episode with reward 0, counted in ``info``),
its tool messages are appended and returned as the next observation → until the environment ends
the episode, or the driver does (``stop``: its own turn limit, or a context that no longer fits;
reward 0). The state keeps the OpenAI-style transcript, turns, tool calls, token counts and the end.

Three drivers advance it: ``play`` (one episode, a ``policy(env) -> AssistantTurn`` such as the
scripted expert; SFT renders its transcripts with ``data.chat.encode_chat``), ``eval.agent.harness``
``run_episode`` (one episode, a message-level policy over an OpenAI-compatible endpoint) and
``agent.rollout.collect`` (many episodes in lock-step with batched engine calls, token by token).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from longmoe.data.chat import AssistantTurn, parse_assistant
from longmoe.envs.base import Env, Message

Policy = Callable[[Env], AssistantTurn]

CUT_TURN = "the turn reached max_turn_tokens without <|end|>"  # the malformed reason of a cut turn


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


def parse_turn(text: str, cut: bool = False) -> AssistantTurn:
    """Generated assistant text as the turn the environment steps on; a turn ``cut`` by the token
    limit (no ``<|end|>``) is malformed, whatever it says."""
    return AssistantTurn(text, malformed=CUT_TURN) if cut else parse_assistant(text)


class EpisodeState:
    """One episode in progress (see the module docstring); ``done`` once it has ended."""

    def __init__(self, env: Env, seed: int) -> None:
        self.env, self.seed = env, seed
        self.messages: list[Message] = env.reset(seed)
        self.state_keys: list[str] = []
        self.turns = 0
        self.tool_calls = 0  # calls the policy made (the env's info counts those it ran)
        self.generated = 0  # completion tokens over the episode, as the driver counted them
        self.tokens: int | None = None  # the conversation's length at the last turn, if counted
        self.last: AssistantTurn | None = None
        self.done = False
        self.stopped = False  # ended by the driver (``stop``), not by the environment
        self.reward: float = 0.0
        self.info: dict[str, Any] = {}
        self.truncated = False  # the env's turn limit, or the driver's
        self.overflow = False  # the conversation outgrew the context

    def begin_turn(self) -> str:
        """Record (and return) the knowledge state before the next assistant turn."""
        key = self.env.state_key()
        self.state_keys.append(key)
        return key

    def step(
        self,
        turn: AssistantTurn,
        message: Message | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
    ) -> list[Message]:
        """Apply the policy's ``turn`` (``message``: its transcript form, ``assistant_message(turn)``
        by default); returns the environment's messages, appended to the transcript (the next
        observation unless the episode ended)."""
        if self.done:
            raise RuntimeError("the episode is over")
        self.turns += 1
        self.tool_calls += len(turn.tool_calls)
        self.generated += completion_tokens or 0
        if prompt_tokens is not None:
            self.tokens = prompt_tokens + (completion_tokens or 0)
        self.last = turn
        self.messages.append(assistant_message(turn) if message is None else message)
        res = self.env.step(turn)
        self.messages += res.messages
        if res.done:
            self.done, self.reward, self.info = True, res.reward, res.info
            self.truncated = bool(self.info.get("truncated", False))
        return res.messages

    def stop(self, truncated: bool = False, overflow: bool = False) -> None:
        """End the episode from outside the environment (reward 0, no ``info``)."""
        self.done, self.stopped, self.truncated, self.overflow = True, True, truncated, overflow

    @property
    def malformed(self) -> bool:
        """The environment ended the episode on a malformed turn (as it counted it, or as parsed)."""
        if not self.done or self.stopped or self.last is None:
            return False
        return bool(self.info.get("malformed")) or self.last.malformed is not None

    @property
    def malformed_reason(self) -> str | None:
        if not self.done or self.stopped or self.last is None:
            return None
        return self.info.get("malformed_reason") or self.last.malformed


def expert_policy(env: Env) -> AssistantTurn:
    return env.expert()


def play(env: Env, seed: int, policy: Policy = expert_policy, max_turns: int = 10_000) -> Episode:
    """Run ``policy`` on the task ``seed`` until the episode ends (the env's own turn limit applies)."""
    ep = EpisodeState(env, seed)
    while not ep.done:
        if ep.turns >= max_turns:
            raise RuntimeError(f"episode did not end within {max_turns} turns")
        ep.begin_turn()
        ep.step(with_call_ids(policy(env), ep.tool_calls + 1))
    return Episode(ep.messages, ep.reward, ep.info, ep.state_keys)
