"""Curriculum: stage switching by token budget, replay share, resume of the whole data position."""

from __future__ import annotations

import pytest

from longmoe.config import ConfigError
from longmoe.data.curriculum import Curriculum
from longmoe.data.tokenizer import tokenizer_for_tests
from longmoe.train.config import CurriculumStage, TrainConfig


def _stages() -> list[CurriculumStage]:
    return [
        CurriculumStage("a", window=32, tokens=32 * 4 * 3, batch_size=4),
        CurriculumStage(
            "b",
            window=128,
            tokens=3 * 256,
            batch_size=1,
            mix={"package": 1.0},
            replay_fraction=0.5,
            replay_window=32,
        ),
        CurriculumStage(
            "c",
            window=256,
            tokens=2 * 336,
            batch_size=1,
            mix={"package": 1.0},
            replay_fraction=0.25,
            replay_window=16,
        ),
    ]


def test_stage_switching_and_replay_share() -> None:
    """Batches follow the stage budgets; later stages carry short windows making up replay_fraction."""
    cur = Curriculum(_stages(), tokenizer_for_tests(), seed=0)
    seen = []
    while not cur.done:
        b = cur.next_batch()
        n = b["input_ids"].shape[1]
        short = n - b["long_tokens"]
        seen.append((b["stage"], b["window"], n, short / n))
    assert [s for s, *_ in seen] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert all(w == 32 and f == 0 for s, w, _, f in seen if s == 0)
    assert all(w == 128 and f == pytest.approx(0.5, abs=1e-9) for s, w, _, f in seen if s == 1)
    assert all(w == 256 and f == pytest.approx(0.25, abs=0.02) for s, w, _, f in seen if s == 2)


def test_batch_mixes_long_and_short_segments() -> None:
    """In a replay stage, cu_seqlens shows window boundaries at both the long and short window sizes."""
    cur = Curriculum(_stages(), tokenizer_for_tests(), seed=0)
    for _ in range(3):
        cur.next_batch()
    b = cur.next_batch()
    cu = set(b["cu_seqlens"].tolist())
    assert {128, 160, 192, 224, 256} <= cu


def test_curriculum_resume_same_batches() -> None:
    """Restoring the saved position mid-stage reproduces the following batches exactly (across a switch)."""
    tok = tokenizer_for_tests()
    a = Curriculum(_stages(), tok, seed=5)
    for _ in range(4):
        a.next_batch()
    state = a.state()
    ref = [a.next_batch()["input_ids"] for _ in range(4)]
    b = Curriculum(_stages(), tok, seed=5)
    b.restore(state)
    got = [b.next_batch()["input_ids"] for _ in range(4)]
    assert all((x == y).all() for x, y in zip(ref, got))


def test_stage_validation_names_field() -> None:
    """Invalid stage fields are rejected with the field path in the message."""
    with pytest.raises(ConfigError, match=r"stages\[0\]\.replay_fraction"):
        TrainConfig(stages=[CurriculumStage("x", window=8, tokens=8, replay_fraction=1.5)])
    with pytest.raises(ConfigError, match=r"stages\[1\]\.window"):
        TrainConfig(stages=[{"name": "a", "window": 8, "tokens": 8}, {"name": "b", "window": 0, "tokens": 8}])
