"""Policies the agent evaluation can ask for an assistant turn: a local model or any OpenAI endpoint.

Each has ``turn(messages, env, max_tokens) -> AgentReply``: the parsed turn the environment
steps on, the message to append to the conversation, and the token counts. Decoding is greedy.
Model policies read only ``messages`` and ``env.tools``; ``ExpertAgent`` asks ``env.expert()`` (a
reference run: the loop and the environments at success 1.0, and their token counts).

A local model does not go through a policy here: ``eval.agent.local`` runs RL's batched rollouts.

- ``EndpointAgent``: ``POST {url}/v1/chat/completions`` with ``tools`` and ``tool_choice: "auto"``
  (OpenAI function calling). ``message.tool_calls`` become the turn's calls; a call whose
  ``arguments`` are not a JSON object makes the turn malformed. A server that returns a broken call
  as plain text (longmoe's does, as most do) shows it as a wrong final answer, not as malformed.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace
from typing import Any, Protocol

from longmoe.data.chat import AssistantTurn, ToolCall, render_message, render_messages
from longmoe.data.tokenizer import Tokenizer
from longmoe.envs import Env
from longmoe.envs.episode import assistant_message
from longmoe.eval.clients import ClientError, HTTPEndpoint

Message = dict[str, Any]


class ContextOverflow(ClientError):
    """The conversation no longer fits the model's context: the episode ends (reward 0)."""


@dataclass
class AgentReply:
    turn: AssistantTurn
    message: Message  # to append to the conversation (OpenAI shape, call ids included)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class AgentPolicy(Protocol):
    name: str

    def turn(self, messages: list[Message], env: Env, max_tokens: int) -> AgentReply: ...

    def close(self) -> None: ...


class ExpertAgent:
    """The environment's scripted expert; tokens counted with ``tokenizer`` as a local model would."""

    name = "expert"

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._ids = itertools.count(1)

    def turn(self, messages: list[Message], env: Env, max_tokens: int) -> AgentReply:
        turn = env.expert()
        turn = replace(
            turn, tool_calls=tuple(replace(tc, id=f"call_{next(self._ids)}") for tc in turn.tool_calls)
        )
        msg = assistant_message(turn)
        prompt = len(self.tokenizer.encode(render_messages(messages, tools=env.tools)))
        body = render_message(msg)[1]
        return AgentReply(turn, msg, prompt, len(self.tokenizer.encode(body)))

    def close(self) -> None:
        pass


def turn_from_message(msg: dict[str, Any]) -> AssistantTurn:
    """An OpenAI response ``message`` as a parsed turn (arguments that are not a JSON object:
    malformed, with the reason)."""
    content = msg.get("content") or ""
    calls: list[ToolCall] = []
    for j, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments") or "{}"
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as e:
            return AssistantTurn(content, tuple(calls), f"tool call {j}: arguments are not JSON ({e.msg})")
        if not isinstance(name, str) or not name or not isinstance(args, dict):
            return AssistantTurn(
                content, tuple(calls), f"tool call {j}: expected a name and object arguments"
            )
        calls.append(ToolCall(name, args, tc.get("id")))
    return AssistantTurn(content, tuple(calls))


class EndpointAgent(HTTPEndpoint):
    """Any OpenAI-compatible ``/v1/chat/completions`` with function calling."""

    def __init__(self, url: str, model: str, api_key: str | None = None, **opts: Any) -> None:
        super().__init__(url, model, "chat/completions", api_key, **opts)

    def turn(self, messages: list[Message], env: Env, max_tokens: int) -> AgentReply:
        body = {
            "model": self.model,
            "messages": messages,
            "tools": env.tools,
            "tool_choice": "auto",
            "temperature": 0.0,
            "max_tokens": max_tokens,
        }
        r = self.post(body)
        if r.status_code == 400 and "context" in r.text:
            raise ContextOverflow(f"{self.url}: {r.text[:300]}")
        data, choice = self.first_choice(r)
        msg = choice.get("message")
        if not isinstance(msg, dict):
            raise ClientError(f"{self.url} returned an unexpected body: {r.text[:300]}")
        turn = turn_from_message(msg)
        keep: Message = {"role": "assistant", "content": msg.get("content")}
        if msg.get("tool_calls"):
            keep["tool_calls"] = msg["tool_calls"]
        usage = data.get("usage") or {}
        return AgentReply(turn, keep, usage.get("prompt_tokens"), usage.get("completion_tokens"))


class ExpertForcedAgent:
    """Asks ``inner`` for every turn (a real request: the conversation so far and the tools, its
    tokens counted) but plays the environment's expert move instead: an episode of full length
    from any model, untrained ones too, to measure serving at episode length (a horizon-32
    episode through the HTTP server; ``bench/rollout_long.py``). The conversation sent is exactly
    the expert's transcript so far. Never a score of ``inner``: the reward is the expert's."""

    def __init__(self, inner: AgentPolicy) -> None:
        self.inner = inner
        self.name = f"{inner.name}+forced"
        self.replies: list[AgentReply] = []  # what ``inner`` answered, turn by turn
        self._ids = itertools.count(1)

    def turn(self, messages: list[Message], env: Env, max_tokens: int) -> AgentReply:
        reply = self.inner.turn(messages, env, max_tokens)
        self.replies.append(reply)
        move = env.expert()
        move = replace(
            move, tool_calls=tuple(replace(tc, id=f"call_{next(self._ids)}") for tc in move.tool_calls)
        )
        return AgentReply(move, assistant_message(move), reply.prompt_tokens, reply.completion_tokens)

    def close(self) -> None:
        self.inner.close()
