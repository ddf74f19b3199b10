"""The environment interface for agentic post-training and agent evaluation.

An environment is a seeded, deterministic task behind tools. ``reset(seed)`` draws a task and
returns the conversation's opening messages (a system message naming the tools, the user's
question); then each assistant turn goes to ``step``, which runs the turn's tool calls and returns
their results as ``tool`` messages, or ends the episode. Reward is terminal only: 1.0 for a right
final answer, 0.0 otherwise; a malformed turn (or a call to an unknown tool, or bad arguments) ends
the episode with 0.0 and is counted in ``info["malformed"]``.

``state_key`` names the environment's state (what the agent has learnt so far, not how it got
there) so that a step-wise advantage can group identical states across a group's trajectories
(GiGPO's anchor states). ``expert`` is a scripted policy that always succeeds, used to render SFT
demonstrations and to test the environment.

Everything is a pure function of the seed: no clock, no real shell, no network. Held-out tasks
use seeds from ``HELD_OUT_SEED_BASE`` up, which training never draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from longmoe.data.chat import AssistantTurn, render_tools
from longmoe.errors import UserError

HELD_OUT_SEED_BASE = 1_000_000_000  # training seeds stay below, evaluation seeds start here

Message = dict[str, Any]  # an OpenAI-style chat message


class EnvConfigError(UserError, ValueError):
    """An environment request that cannot be built (unknown name, a config field out of range)."""


def describe_tools(tools: list[dict[str, Any]]) -> str:
    """The tools as the opening system message lists them: ``data.chat.render_tools`` (one
    ``name(arg: type, ...)`` line each), the same block the server shows for a request's ``tools``.

    The environments put this in their system message, so a trajectory is self-contained (SFT, RL
    and local evaluation render the same text); ``tools`` also goes to OpenAI-compatible endpoints,
    and longmoe's server, seeing the block already there, does not add it twice (``with_tools``).
    """
    return render_tools(tools)


@dataclass
class StepResult:
    """What one assistant turn led to: tool messages to append, or the end with its reward."""

    messages: list[Message]
    done: bool
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    """A tool-using task; see the module docstring for the contract."""

    name: str
    tools: list[dict[str, Any]]  # OpenAI function schemas ({"type": "function", "function": {...}})

    def reset(self, seed: int) -> list[Message]:
        """Start the task drawn by ``seed``; returns the opening messages (system + user)."""
        ...

    def step(self, turn: AssistantTurn) -> StepResult:
        """Apply one parsed assistant turn (its tool calls, or its final answer)."""
        ...

    def state_key(self) -> str:
        """A hashable description of the current state, equal for equal states across episodes."""
        ...

    def expert(self) -> AssistantTurn:
        """The scripted expert's next turn from the current state (always reaches reward 1)."""
        ...

    @property
    def horizon(self) -> int:
        """The task's number of required steps (document hops, calculations): what success is
        reported against. Each step needs at least one tool call (a document hop needs two)."""
        ...
