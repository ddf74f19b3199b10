"""Agent-test helpers: a tiny fake environment (any turn is accepted) and a saved tiny model."""

from __future__ import annotations

import torch

from longmoe.data.chat import AssistantTurn
from longmoe.envs.base import StepResult
from longmoe.model import LongMoE
from longmoe.presets import preset

VOCAB = 512


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


def tiny_model(seed: int = 0) -> LongMoE:
    torch.manual_seed(seed)
    cfg = preset("tiny").replace(vocab_size=VOCAB, max_seq_len=1024, tie_embeddings=False)
    m = LongMoE(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return m.eval()
