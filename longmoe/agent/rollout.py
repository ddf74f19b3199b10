"""Rollouts: many multi-turn episodes at once through the serving engine, recorded for RL.

``collect(engine, make_env, seeds, cfg)`` plays ``cfg.group_size`` episodes of every task seed, all
concurrently: each episode is the shared turn loop (``envs.episode.EpisodeState``) advanced by its
completions, so the engine always holds as many assistant turns as it has room for. An episode
(``serve/session.py``) keeps its cache row across turns: a turn submits only the new tokens (the
tool results and the next ``<|assistant|>`` header), never the whole trajectory again.
``cfg.sessions=False`` resubmits the whole trajectory each turn instead (what ``bench/rollout.py``
compares against).

Tokens are recorded exactly as sampled (no re-tokenisation of the text), so the trainer scores the
very ids the policy produced. The layout follows ``data.chat``: the opening (``<|bos|>``, system,
user, ``<|assistant|>\\n``), then per turn the policy's tokens up to and including ``<|end|>``, then
the observation (``\\n``, one ``<|tool_result|>`` message per call, ``<|assistant|>\\n``).
``policy_mask`` is True exactly on the policy's tokens; ``logprobs`` holds the rollout policy's
log-probability of each of them (the model's raw distribution, 0 elsewhere).

An episode ends when the environment says so; a turn cut by ``max_turn_tokens`` (no ``<|end|>``) is
passed to the environment as malformed (reward 0, counted), and an episode that would outgrow
``max_episode_tokens`` ends truncated with reward 0.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from longmoe.data.chat import encode_chat
from longmoe.envs.base import Env
from longmoe.envs.episode import EpisodeState, parse_turn
from longmoe.serve.engine import Engine
from longmoe.serve.request import Completion, Event
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.session import Session
from longmoe.validation import FLAG_MESSAGE, check, check_int_range


@dataclass(frozen=True)
class RolloutConfig:
    """How episodes are sampled (validated).

    ``group_size``: episodes per task (G); ``max_turn_tokens``: tokens one assistant turn may
    generate; ``max_episode_tokens``: the whole trajectory's limit; ``temperature`` / ``top_p``:
    sampling (logprobs are always the raw model's, so 1.0 / 1.0 keep PPO's ratio exact);
    ``sessions``: keep each episode's cache across turns (False: resubmit the trajectory each turn);
    ``seed``: sampling seeds derive from it, the task seed, the sample index and the turn.
    """

    group_size: int = 8
    max_turn_tokens: int = 64
    max_episode_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    sessions: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for f in ("group_size", "max_turn_tokens", "max_episode_tokens"):
            check_int_range(f, getattr(self, f), 1, message=FLAG_MESSAGE)
        t, p = self.temperature, self.top_p
        check(0.0 <= t <= 100.0, "temperature", t, "a number in [0, 100]", message=FLAG_MESSAGE)
        check(0.0 < p <= 1.0, "top_p", p, "a number in (0, 1]", message=FLAG_MESSAGE)


@dataclass
class TurnRecord:
    """One assistant turn: its policy tokens are ``ids[start:end]`` of the trajectory."""

    start: int
    end: int
    state_key: str  # the environment's knowledge state before the turn (step-wise grouping)
    malformed: str | None = None
    prefilled: int = 0  # context tokens the engine prefilled for this turn
    cached: int = 0  # context tokens it reused (the session's kept row or a prefix snapshot)


@dataclass
class Trajectory:
    """One finished episode, token by token (see the module docstring)."""

    task: int  # index of the task seed in ``collect``'s ``seeds``
    seed: int
    sample: int  # index inside the task's group
    horizon: int
    ids: list[int] = field(default_factory=list)
    policy_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    malformed: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def policy_tokens(self) -> int:
        return sum(self.policy_mask)

    def extend(self, ids: Sequence[int], policy: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids += ids
        self.policy_mask += [policy] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


@dataclass
class _Episode:
    traj: Trajectory  # the token record
    state: EpisodeState  # the shared turn loop: transcript, counters, the end
    session: Session | None


def turn_seed(base: int, task_seed: int, sample: int, turn: int) -> int:
    """The sampling seed of one turn: a pure function, so a resumed run samples the same tokens."""
    return (base * 1_000_003 + task_seed * 9_176 + sample * 7_919 + turn * 104_729) % 2**63


def observation_ids(engine: Engine, messages: list[dict[str, Any]]) -> list[int]:
    """Tokens after a policy turn: the turn's closing newline, the tool results, the next header."""
    tok = engine.tokenizer
    return tok.encode("\n") + encode_chat(tok, messages, add_generation_prompt=True).ids


def collect(
    engine: Engine,
    make_env: Callable[[int], Env],
    seeds: Sequence[int],
    cfg: RolloutConfig,
) -> list[Trajectory]:
    """Play ``cfg.group_size`` episodes of every task in ``seeds`` concurrently; trajectories in
    (task, sample) order. ``make_env(i)`` builds a fresh environment for task ``i`` (e.g. of its
    horizon); ``reset(seeds[i])`` draws the task. Each episode is an ``envs.episode.EpisodeState``
    advanced by its completions, the engine batching every episode's turn."""
    done_q: queue.Queue[tuple[int, Completion]] = queue.Queue()
    eps: list[_Episode] = []
    pending: dict[int, list[int]] = {}  # episode -> the context tokens its next turn submits
    for ti, s in enumerate(seeds):
        for g in range(cfg.group_size):
            st = EpisodeState(make_env(ti), s)
            tr = Trajectory(ti, s, g, st.env.horizon)
            bos = engine.cfg.add_bos
            ids = encode_chat(engine.tokenizer, st.messages, add_generation_prompt=True, bos=bos)
            eps.append(_Episode(tr, st, engine.open_session() if cfg.sessions else None))
            pending[len(eps) - 1] = ids.ids
    live = 0
    with engine.driven_here():  # the steps run here, in the thread that built (and trains) the model
        for i in list(pending):
            live += _submit(engine, eps[i], i, pending.pop(i), cfg, done_q)
        while live:
            while done_q.empty() and engine.pump():
                pass
            i, c = done_q.get()  # (pump False: another thread runs the steps)
            live -= 1
            obs = _advance(engine, eps[i], c)
            if obs is not None:
                live += _submit(engine, eps[i], i, obs, cfg, done_q)
    return [e.traj for e in eps]


def _submit(
    engine: Engine, ep: _Episode, i: int, new: list[int], cfg: RolloutConfig, done_q: queue.Queue
) -> int:
    """Append the context tokens ``new`` and submit the episode's next turn (1), or end the episode
    truncated when they would leave no room for a turn (0; ``new`` is then dropped)."""
    tr = ep.traj
    room = min(cfg.max_episode_tokens, engine.max_context) - len(tr.ids) - len(new)
    if room < 2:
        ep.state.stop(overflow=True)
        _finish(engine, ep)
        return 0
    tr.extend(new, False)
    tr.turns.append(TurnRecord(len(tr.ids), len(tr.ids), ep.state.begin_turn()))
    params = SamplingParams(
        max_tokens=min(cfg.max_turn_tokens, room - 1),
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        seed=turn_seed(cfg.seed, tr.seed, tr.sample, len(tr.turns)),
        logprobs=True,
    )

    def sink(ev: Event) -> None:
        if ev.done is not None:
            done_q.put((i, ev.done))

    if ep.session is not None:
        engine.submit(new, params, sink, session=ep.session)
    else:
        engine.submit(list(tr.ids), params, sink)
    return 1


def _advance(engine: Engine, ep: _Episode, c: Completion) -> list[int] | None:
    """Record a finished turn and step the episode: the next observation's tokens, or None."""
    tr, turn = ep.traj, ep.traj.turns[-1]
    if c.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"rollout turn failed ({c.finish_reason}): {c.error}")
    turn.cached, turn.prefilled = c.cached_tokens, c.prompt_tokens - c.cached_tokens
    tr.extend(c.token_ids, True, c.logprobs)
    turn.end = len(tr.ids)
    parsed = parse_turn(engine.tokenizer.decode(c.token_ids), cut=c.finish_reason == "length")
    turn.malformed = parsed.malformed
    obs = ep.state.step(parsed, prompt_tokens=turn.start, completion_tokens=len(c.token_ids))
    if ep.state.done:
        _finish(engine, ep)
        return None
    return observation_ids(engine, obs)


def _finish(engine: Engine, ep: _Episode) -> None:
    """Copy the episode's end into its trajectory and release its session."""
    tr, st = ep.traj, ep.state
    tr.reward, tr.info = float(st.reward), dict(st.info)
    tr.success = bool(tr.info.get("success", False))
    tr.malformed = bool(tr.info.get("malformed", 0))  # as the environment counted it
    tr.truncated = st.truncated or st.overflow
    if ep.session is not None:
        engine.close_session(ep.session)
