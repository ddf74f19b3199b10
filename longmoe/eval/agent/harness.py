"""Agent evaluation: episode success by horizon on the tool environments, for any policy.

``run_episode`` plays one held-out task (the shared turn loop, ``envs.episode.EpisodeState``): the
environment's opening messages, then turn by turn the policy's reply (``eval.agent.policies``: an
OpenAI-compatible endpoint through its function-calling API, or the scripted expert) is stepped by
the environment, whose tool messages are appended, until the episode ends (final answer, malformed
turn, the environment's turn limit, or a conversation that no longer fits the context: reward 0,
``overflow``).

``run_agent_eval`` plays ``n`` episodes per (environment, horizon) cell on the held-out seeds
``HELD_OUT_SEED_BASE + seed + i`` (never drawn in training), ``concurrency`` at a time (a local
engine batches them), appends each to ``OUT/agent_episodes.jsonl`` and ``summarize`` reports per
cell and per environment: success rate with its standard error ``sqrt(p (1 - p) / n)``, the share of
episodes ended by a malformed turn and the tool-call validity (valid assistant turns / turns),
truncated and overflowed episodes, turns, tool calls, and tokens per episode (the final
conversation's length as the backend counted it, and the tokens generated).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from longmoe.envs import HELD_OUT_SEED_BASE, Env
from longmoe.envs.episode import EpisodeState
from longmoe.eval.agent.policies import AgentPolicy, ContextOverflow

EPISODES_FILE = "agent_episodes.jsonl"
SUMMARY_FILE = "agent_summary.json"
MARKDOWN_FILE = "agent_summary.md"

EnvFactory = Callable[[], Env]  # a fresh environment for one episode


@dataclass
class EpisodeResult:
    env: str
    horizon: int
    seed: int
    reward: float = 0.0
    success: bool = False
    malformed: bool = False
    malformed_reason: str | None = None
    truncated: bool = False
    overflow: bool = False
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tokens: int | None = None  # the conversation's length at the last turn (prompt + completion)
    generated: int = 0  # completion tokens over the episode


def run_episode(
    policy: AgentPolicy, env: Env, seed: int, max_tokens: int, max_turns: int = 1000
) -> EpisodeResult:
    """Play the task ``seed`` of ``env`` with ``policy`` to its end (see the module docstring): one
    ``envs.episode.EpisodeState`` advanced a message-level turn at a time."""
    ep = EpisodeState(env, seed)
    while not ep.done:
        if ep.turns >= max_turns:
            ep.stop(truncated=True)
            break
        try:
            reply = policy.turn(ep.messages, env, max_tokens)
        except ContextOverflow:
            ep.stop(overflow=True)
            break
        ep.step(reply.turn, reply.message, reply.prompt_tokens, reply.completion_tokens)
    return episode_record(ep)


def episode_record(ep: EpisodeState) -> EpisodeResult:
    """A finished episode as an evaluation record."""
    return EpisodeResult(
        ep.env.name,
        ep.env.horizon,
        ep.seed,
        reward=ep.reward,
        success=ep.reward > 0,
        malformed=ep.malformed,
        malformed_reason=ep.malformed_reason,
        truncated=ep.truncated,
        overflow=ep.overflow,
        turns=ep.turns,
        tool_calls=ep.tool_calls,
        tool_errors=int(ep.info.get("tool_errors", 0)),
        tokens=ep.tokens,
        generated=ep.generated,
    )


def held_out_seeds(n: int, offset: int = 0) -> list[int]:
    """The evaluation seeds: ``n`` from ``HELD_OUT_SEED_BASE + offset`` (training stays below the base)."""
    return [HELD_OUT_SEED_BASE + offset + i for i in range(n)]


def run_agent_eval(
    policy: AgentPolicy,
    cells: dict[tuple[str, int], EnvFactory],
    n: int,
    out: str | Path,
    seed: int = 0,
    max_tokens: int = 256,
    concurrency: int = 8,
    progress: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Play ``n`` held-out episodes per ``(env name, horizon)`` cell; write them to
    ``OUT/agent_episodes.jsonl`` (one JSON object per episode, in cell and seed order)."""
    jobs = [(make, s) for make in cells.values() for s in held_out_seeds(n, seed)]

    def play(job: tuple[EnvFactory, int]) -> EpisodeResult:
        make, s = job
        r = run_episode(policy, make(), s, max_tokens)
        if progress is not None:
            progress(r)
        return r

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(play, jobs))
    path = Path(out) / EPISODES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(r)) + "\n" for r in results))
    return results


def _stats(rs: list[EpisodeResult]) -> dict[str, Any]:
    n = len(rs)
    p = sum(r.success for r in rs) / n
    turns = sum(r.turns for r in rs)
    bad_turns = sum(r.malformed for r in rs)  # a malformed turn ends its episode: at most one each
    toks = [r.tokens for r in rs if r.tokens is not None]
    return {
        "episodes": n,
        "success": p,
        "se": math.sqrt(p * (1 - p) / n),
        "malformed": sum(r.malformed for r in rs) / n,
        "validity": 1.0 - bad_turns / turns if turns else None,
        "truncated": sum(r.truncated for r in rs) / n,
        "overflow": sum(r.overflow for r in rs) / n,
        "turns": turns / n,
        "tool_calls": sum(r.tool_calls for r in rs) / n,
        "tokens": sum(toks) / len(toks) if toks else None,
        "generated": sum(r.generated for r in rs) / n,
    }


def _groups(results: list[EpisodeResult], key: Callable[[EpisodeResult], Any]) -> Iterator[tuple[Any, list]]:
    groups: dict[Any, list[EpisodeResult]] = {}
    for r in results:
        groups.setdefault(key(r), []).append(r)
    yield from sorted(groups.items())


def summarize(results: list[EpisodeResult], model: str = "") -> dict[str, Any]:
    """Per (env, horizon) cell, per env, and overall statistics (see the module docstring)."""
    if not results:
        raise ValueError("no episodes to summarize")
    return {
        "model": model,
        "by_horizon": [
            {"env": e, "horizon": h, **_stats(rs)}
            for (e, h), rs in _groups(results, lambda r: (r.env, r.horizon))
        ],
        "by_env": [{"env": e, **_stats(rs)} for e, rs in _groups(results, lambda r: r.env)],
        "overall": _stats(results),
    }


def _fmt(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def markdown_agent(summary: dict[str, Any]) -> str:
    """The summary as a markdown table: one row per (env, horizon) cell, then one per env."""
    cols = ["env", "horizon", "episodes", "success", "± se", "malformed", "validity", "truncated", "turns"]
    head = "| " + " | ".join([*cols, "tokens/episode"]) + " |"
    lines = [f"agent eval: {summary['model']}", "", head, "|" + "---|" * (len(cols) + 1)]
    rows = [*summary["by_horizon"], *({**r, "horizon": "all"} for r in summary["by_env"])]
    for r in rows:
        tokens = "-" if r["tokens"] is None else f"{r['tokens']:.0f}"
        lines.append(
            f"| {r['env']} | {r['horizon']} | {r['episodes']} | {_fmt(r['success'])} | {_fmt(r['se'])} | "
            f"{_fmt(r['malformed'])} | {_fmt(r['validity'])} | {_fmt(r['truncated'])} | "
            f"{r['turns']:.1f} | {tokens} |"
        )
    return "\n".join(lines) + "\n"


def write_agent_summary(results: list[EpisodeResult], out: str | Path, model: str = "") -> dict[str, Any]:
    """``OUT/agent_summary.{json,md}``; returns the summary."""
    summary = summarize(results, model)
    out = Path(out)
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    (out / MARKDOWN_FILE).write_text(markdown_agent(summary))
    return summary
