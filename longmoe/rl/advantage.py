"""Advantages for a group of rollouts of one task: episode-level (group-relative) plus step-wise.

**Episode advantage** (GRPO): the group's ``G`` terminal rewards ``R_i`` give
``A^E_i = (R_i - mean(R)) / (std(R) + eps)`` (``std_norm=False``: no division). A group of identical
rewards carries no signal: every ``A^E`` is 0.

**Step-wise advantage** (GiGPO, Feng et al. 2025): turns of different trajectories that start from the
same environment state (equal ``state_key``: the same knowledge, however it was reached) form an
*anchor group*. Each such turn's return is the discounted terminal reward
``G_{i,t} = γ^{T_i - 1 - t} R_i`` (``T_i`` turns in trajectory ``i``), so among turns taken from the
same state, the one that leads to success sooner scores higher. ``A^S_{i,t} = (G_{i,t} - mean) /
(std + eps)`` over the anchor group (0 for a group of one).

The turn's advantage is ``A^E_i + ω · A^S_{i,t}`` (``ω = 0`` ablates the step-wise part); every
policy token of the turn gets it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

EPS = 1e-6


def normalise(x: torch.Tensor, std_norm: bool) -> torch.Tensor:
    """``x - mean(x)``, divided by ``std(x) + eps`` if ``std_norm`` (unbiased=False; 0 for one element)."""
    if x.numel() < 2:
        return torch.zeros_like(x)
    d = x - x.mean()
    return d / (x.std(unbiased=False) + EPS) if std_norm else d


def episode_advantages(rewards: Sequence[float], std_norm: bool = True) -> list[float]:
    """Group-relative advantage of each of the group's trajectories."""
    return normalise(torch.tensor(rewards, dtype=torch.float64), std_norm).tolist()


def discounted_returns(reward: float, n_turns: int, gamma: float) -> list[float]:
    """``γ^{T-1-t} · R`` for turns ``t = 0..T-1`` of a trajectory with terminal reward ``R``."""
    return [reward * gamma ** (n_turns - 1 - t) for t in range(n_turns)]


def step_advantages(
    state_keys: Sequence[Sequence[str]],
    rewards: Sequence[float],
    gamma: float = 0.95,
    std_norm: bool = True,
) -> list[list[float]]:
    """Per trajectory, per turn: the turn's return relative to the other turns of the group taken from
    the same state (``state_keys[i][t]``: the state before turn ``t`` of trajectory ``i``)."""
    returns = [discounted_returns(r, len(k), gamma) for k, r in zip(state_keys, rewards, strict=True)]
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i, keys in enumerate(state_keys):
        for t, key in enumerate(keys):
            groups[key].append((i, t))
    out = [[0.0] * len(k) for k in state_keys]
    for members in groups.values():
        vals = torch.tensor([returns[i][t] for i, t in members], dtype=torch.float64)
        for (i, t), a in zip(members, normalise(vals, std_norm).tolist(), strict=True):
            out[i][t] = a
    return out


def turn_advantages(
    state_keys: Sequence[Sequence[str]],
    rewards: Sequence[float],
    step_weight: float = 1.0,
    gamma: float = 0.95,
    std_norm: bool = True,
) -> list[list[float]]:
    """``A^E_i + ω · A^S_{i,t}`` for every turn of every trajectory of one group."""
    ep = episode_advantages(rewards, std_norm)
    st = step_advantages(state_keys, rewards, gamma, std_norm) if step_weight else None
    return [
        [ep[i] + (step_weight * st[i][t] if st is not None else 0.0) for t in range(len(keys))]
        for i, keys in enumerate(state_keys)
    ]
