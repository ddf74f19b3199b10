"""The agent evaluation of a local model: RL's batched rollouts (``longmoe.agent.rollout.collect``),
greedy by default, scored like any other backend (the agent recipe evaluates its models with it too).

Every episode of a cell runs at once in the engine, each on its own session: a turn prefills only
the new observation (its cache row is kept across turns), so long episodes cost what RL's cost.
The prompt is the environment's messages rendered by ``data.chat.encode_chat`` (their system
message carries the tools block), exactly what SFT and RL train on. A turn cut by ``max_tokens``
(no ``<|end|>``) is a malformed turn, as in RL; an episode that outgrows the engine's context ends
with reward 0 and is counted as ``overflow``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from longmoe.agent.rollout import RolloutConfig, Trajectory, collect
from longmoe.eval.agent.harness import EPISODES_FILE, EnvFactory, EpisodeResult, held_out_seeds
from longmoe.serve.engine import Engine


def episode_result(env: str, t: Trajectory) -> EpisodeResult:
    """A rollout's trajectory as an evaluation record."""
    info = t.info
    overflow = t.truncated and "truncated" not in info  # cut by the context, not by the env's turn limit
    return EpisodeResult(
        env=env,
        horizon=t.horizon,
        seed=t.seed,
        reward=t.reward,
        success=t.success,
        malformed=t.malformed,
        malformed_reason=info.get("malformed_reason"),
        truncated=t.truncated and not overflow,
        overflow=overflow,
        turns=len(t.turns),
        tool_calls=int(info.get("tool_calls", 0)),
        tool_errors=int(info.get("tool_errors", 0)),
        tokens=len(t.ids),
        generated=t.policy_tokens,
    )


def run_local_eval(
    engine: Engine,
    cells: dict[tuple[str, int], EnvFactory],
    n: int,
    out: str | Path,
    seed: int = 0,
    max_tokens: int = 256,
    progress: Callable[[list[EpisodeResult]], None] | None = None,
    temperature: float = 0.0,
) -> list[EpisodeResult]:
    """``n`` held-out episodes per cell (greedy unless ``temperature`` > 0), all cells at once;
    written to ``OUT/agent_episodes.jsonl``. ``progress`` gets each cell's results as it finishes."""
    cfg = RolloutConfig(
        group_size=1, max_turn_tokens=max_tokens, max_episode_tokens=engine.max_context,
        temperature=temperature, seed=seed,
    )  # fmt: skip
    seeds = held_out_seeds(n, seed)

    def cell(item: tuple[tuple[str, int], EnvFactory]) -> list[EpisodeResult]:
        (name, _), make = item
        rs = [episode_result(name, t) for t in collect(engine, lambda _task: make(), seeds, cfg)]
        if progress is not None:
            progress(rs)
        return rs

    with ThreadPoolExecutor(max_workers=max(1, len(cells))) as pool:
        results = [r for rs in pool.map(cell, cells.items()) for r in rs]
    path = Path(out) / EPISODES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in results))
    return results
