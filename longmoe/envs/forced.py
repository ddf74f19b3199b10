"""An environment driven by its expert whatever the policy says: episodes of full length from any model.

``ExpertForced(env)`` answers every assistant turn as if the policy had made the expert's move: the
policy's text is read (and counted) but ignored, and ``env.step(env.expert())`` supplies the
observation. An untrained or random model then still produces a horizon-32 episode with the real
observations (pages, query results) at their real sizes, turn after turn: what measuring rollout
throughput, sessions and serving at episode length needs (``bench/rollout_long.py``, the long-horizon
tests). Its reward says nothing about the policy (it is the expert's: 1.0), so it is never used to
score or train a model.
"""

from __future__ import annotations

from typing import Any

from longmoe.data.chat import AssistantTurn
from longmoe.envs.base import Env, Message, StepResult
from longmoe.envs.episode import with_call_ids


class ExpertForced:
    """``env`` stepped with its expert's turns (see the module docstring)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.name = f"{env.name}+forced"
        self.tools: list[dict[str, Any]] = env.tools
        self._calls = 0

    def reset(self, seed: int) -> list[Message]:
        self._calls = 0
        return self.env.reset(seed)

    def step(self, turn: AssistantTurn) -> StepResult:
        move = with_call_ids(self.env.expert(), self._calls + 1)
        self._calls += len(move.tool_calls)
        ids = [c.id for c in turn.tool_calls if c.id]  # the policy's call ids, where it gave any
        res = self.env.step(move)
        for m, i in zip(res.messages, ids, strict=False):
            m["tool_call_id"] = i
        return res

    def state_key(self) -> str:
        return self.env.state_key()

    def expert(self) -> AssistantTurn:
        return self.env.expert()

    @property
    def horizon(self) -> int:
        return self.env.horizon
