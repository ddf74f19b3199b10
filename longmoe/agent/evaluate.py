"""Held-out success by horizon: episodes of a local model through the engine, with standard errors.

``success_by_horizon`` plays ``episodes`` held-out tasks (seeds from ``HELD_OUT_SEED_BASE``, which
training never draws) per horizon, one episode per task, all concurrently, and reports the success
rate with its standard error ``sqrt(p (1 - p) / n)``, the share of malformed episodes, the share of
valid tool calls and the tokens per episode.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from longmoe.agent.rollout import RolloutConfig, collect
from longmoe.envs.base import HELD_OUT_SEED_BASE, Env
from longmoe.serve.engine import Engine


@dataclass
class HorizonResult:
    horizon: int
    episodes: int
    success: float
    stderr: float
    malformed: float  # share of episodes ended by a malformed turn
    tool_call_validity: float  # valid tool calls / all tool calls attempted (malformed turns count)
    tokens_per_episode: float
    turns_per_episode: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def stderr(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else float("nan")


def success_by_horizon(
    engine: Engine,
    make_env: Callable[[int], Env],
    horizons: Sequence[int],
    episodes: int,
    temperature: float = 1.0,
    max_turn_tokens: int = 64,
    max_episode_tokens: int = 2048,
    seed: int = 0,
) -> list[HorizonResult]:
    """``episodes`` held-out tasks per horizon (``make_env(horizon)`` builds the environment)."""
    tasks = [(h, HELD_OUT_SEED_BASE + k) for h in horizons for k in range(episodes)]
    cfg = RolloutConfig(
        group_size=1, max_turn_tokens=max_turn_tokens, max_episode_tokens=max_episode_tokens,
        temperature=temperature, seed=seed,
    )  # fmt: skip
    trajs = collect(engine, lambda i: make_env(tasks[i][0]), [s for _, s in tasks], cfg)
    out = []
    for h in horizons:
        ts = [t for t in trajs if tasks[t.task][0] == h]
        n = len(ts)
        p = sum(t.success for t in ts) / n
        calls = sum(int(t.info.get("tool_calls", 0)) for t in ts)
        bad = sum(t.malformed for t in ts)
        out.append(
            HorizonResult(
                horizon=h,
                episodes=n,
                success=p,
                stderr=stderr(p, n),
                malformed=bad / n,
                tool_call_validity=calls / max(1, calls + bad),
                tokens_per_episode=sum(len(t.ids) for t in ts) / n,
                turns_per_episode=sum(len(t.turns) for t in ts) / n,
            )  # fmt: skip
        )
    return out
