"""The rollout bench's three ways to run an episode (kept session, prefix snapshots, re-prefill) reach the
same state: in float64 their sampled episodes are token for token the same, so the float32 mismatches the
bench reports are rounding at a sampling threshold, not a wrong state."""

from __future__ import annotations

import torch

from bench import rollout


def test_sessions_prefix_snapshots_and_reprefill_sample_the_same_episodes_in_float64():
    with torch.inference_mode():
        runs = {m: rollout.run_mode(m, 2, 3, 20, 6, 1024, dtype=torch.float64) for m in rollout.MODES}
    ids = {m: r["ids"] for m, r in runs.items()}
    assert all(len(t) > 60 for t in ids["session"])
    # the modes really take their own paths: kept rows and restored snapshots prefill less
    assert max(runs["session"]["prefilled"], runs["prefix"]["prefilled"]) < runs["re-prefill"]["prefilled"]
    for m in ("prefix", "re-prefill"):
        assert rollout.agreement(ids["session"], ids[m]) == {"identical": 2, "episodes": 2, "diverged": []}


def test_agreement_names_the_first_differing_token_of_each_other_episode():
    got = rollout.agreement([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6, 7]])
    assert got == {
        "identical": 1,
        "episodes": 2,
        "diverged": [{"episode": 1, "first_diff_token": 1, "tokens": [3, 4]}],
    }
