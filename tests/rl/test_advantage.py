"""Advantages on hand cases: identical rewards give 0, the episode part is group-relative, the
step-wise part groups identical states across trajectories and prefers reaching success sooner."""

from __future__ import annotations

import pytest

from longmoe.rl.advantage import discounted_returns, episode_advantages, step_advantages, turn_advantages


def test_identical_rewards_give_zero():
    for r in (0.0, 1.0):
        assert episode_advantages([r] * 4) == [0.0] * 4
        keys = [["a", "b"], ["a", "c"], ["a"], ["a", "b", "c"]]
        assert turn_advantages(keys, [r] * 4, step_weight=0.0) == [[0.0] * len(k) for k in keys]
    # zero rewards: every return is 0, so every step-wise group is flat too
    assert turn_advantages([["a", "b"], ["a", "b"]], [0.0, 0.0]) == [[0.0, 0.0], [0.0, 0.0]]


def test_episode_advantages_hand_numbers():
    assert episode_advantages([1.0, 0.0, 0.0, 1.0], std_norm=False) == [0.5, -0.5, -0.5, 0.5]
    got = episode_advantages([1.0, 0.0, 0.0, 1.0])  # std = 0.5
    assert got == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert sum(episode_advantages([1.0, 0.0, 0.0])) == pytest.approx(0.0, abs=1e-12)


def test_discounted_returns():
    assert discounted_returns(1.0, 3, 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns(0.0, 2, 0.5) == [0.0, 0.0]


def test_step_wise_groups_identical_states():
    # two successes from state "s0": the one that took 2 turns beats the one that took 3
    keys = [["s0", "s1"], ["s0", "x", "s1"], ["s0"]]
    rewards = [1.0, 1.0, 0.0]
    got = step_advantages(keys, rewards, gamma=0.5, std_norm=False)
    # anchor "s0": returns 0.5 (traj 0), 0.25 (traj 1), 0 (traj 2); mean 0.25
    assert got[0][0] == pytest.approx(0.25) and got[1][0] == pytest.approx(0.0)
    assert got[2][0] == pytest.approx(-0.25)
    # anchor "s1": returns 1.0 and 1.0 -> 0; "x" alone -> 0
    assert got[0][1] == 0.0 and got[1][2] == 0.0 and got[1][1] == 0.0


def test_turn_advantage_combines_episode_and_step():
    keys = [["s0", "s1"], ["s0", "x", "s1"], ["s0"]]
    rewards = [1.0, 1.0, 0.0]
    ep = episode_advantages(rewards, std_norm=False)
    st = step_advantages(keys, rewards, gamma=0.5, std_norm=False)
    got = turn_advantages(keys, rewards, step_weight=0.5, gamma=0.5, std_norm=False)
    for i, k in enumerate(keys):
        for t in range(len(k)):
            assert got[i][t] == pytest.approx(ep[i] + 0.5 * st[i][t])
    no_step = turn_advantages(keys, rewards, step_weight=0.0, std_norm=False)
    assert no_step == [[ep[i]] * len(k) for i, k in enumerate(keys)]
