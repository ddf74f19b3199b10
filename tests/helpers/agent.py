"""A tiny fake environment for the agent and RL tests: any turn is accepted."""

from __future__ import annotations

from longmoe.data.chat import AssistantTurn
from longmoe.envs.base import StepResult


class FakeEnv:
    """``turns`` assistant turns, each answered by a short observation; the last ends the episode
    with reward 1 when the seed plus the total number of characters written is even."""

    name = "fake"
    tools: list = []

    def __init__(self, turns: int = 3) -> None:
        self.n = turns

    def reset(self, seed: int) -> list[dict]:
        self.seed, self.t, self.chars = seed, 0, 0
        return [{"role": "system", "content": "fake"}, {"role": "user", "content": f"task {seed}"}]

    def step(self, turn: AssistantTurn) -> StepResult:
        self.t += 1
        self.chars += len(turn.content)
        if self.t >= self.n:
            ok = (self.seed + self.chars) % 2 == 0
            return StepResult([], True, float(ok), {"success": ok, "malformed": 0})
        return StepResult([{"role": "tool", "content": f"obs {self.t} of {self.seed}"}], False)

    def state_key(self) -> str:
        return f"t{self.t}"

    def expert(self) -> AssistantTurn:
        return AssistantTurn("x")

    @property
    def horizon(self) -> int:
        return self.n
