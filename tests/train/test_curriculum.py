"""Curriculum: stage switching by token budget, replay share, resume of the whole data position."""

from __future__ import annotations

import pytest

from longmoe.config import ConfigError
from longmoe.data.stages import CurriculumStage
from longmoe.train.config import TrainConfig
from longmoe.train.curriculum import Curriculum
from tests.helpers.tokenizer import tokenizer_for_tests


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
        n = b.input_ids.shape[1]
        short = n - b.window * cur.stages[b.stage].batch_size
        seen.append((b.stage, b.window, n, short / n))
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
    cu = set(b.cu_seqlens.tolist())
    assert {128, 160, 192, 224, 256} <= cu


def test_curriculum_resume_same_batches() -> None:
    """Restoring the saved position mid-stage reproduces the following batches exactly (across a switch)."""
    tok = tokenizer_for_tests()
    a = Curriculum(_stages(), tok, seed=5)
    for _ in range(4):
        a.next_batch()
    state = a.state_dict()
    ref = [a.next_batch().input_ids for _ in range(4)]
    b = Curriculum(_stages(), tok, seed=5)
    b.load_state_dict(state)
    got = [b.next_batch().input_ids for _ in range(4)]
    assert all((x == y).all() for x, y in zip(ref, got))


def test_stage_validation_names_field() -> None:
    """Invalid stage fields are rejected with the field path in the message."""
    with pytest.raises(ConfigError, match=r"stages\[0\]\.replay_fraction"):
        TrainConfig(stages=[CurriculumStage("x", window=8, tokens=8, replay_fraction=1.5)])
    with pytest.raises(ConfigError, match=r"stages\[1\]\.window"):
        TrainConfig(stages=[{"name": "a", "window": 8, "tokens": 8}, {"name": "b", "window": 0, "tokens": 8}])
    for bad in ([0.5], [0.6, 0.3], [0.0, 0.5], [0.2, 1.0], ["a", 0.5]):
        with pytest.raises(ConfigError, match=r"stages\[0\]\.synthetic_length"):
            TrainConfig(stages=[CurriculumStage("x", window=8, tokens=8, synthetic_length=bad)])


def test_stage_synthetic_length_reaches_the_documents_and_round_trips(tmp_path) -> None:
    """A stage's synthetic_length sets its task documents' lengths and survives train_config.json."""
    tok = tokenizer_for_tests(512)
    mix = {"synthetic:niah": 1.0}
    short = CurriculumStage("s", window=1024, tokens=1024, mix=mix, synthetic_length=[0.3, 0.35])
    full = CurriculumStage("f", window=1024, tokens=1024, mix=mix)  # the default range, 0.4-0.9
    cur = Curriculum([short, full], tok, seed=0)
    lens = {}
    for st in (short, full):
        src = cur.packer(st.mix, st.window, st.synthetic_loss, st.synthetic_length).source
        lens[st.name] = [len(tok.encode(src.next().text)) for _ in range(6)]
    assert max(lens["s"]) <= 0.35 * 1024 * 1.05 < min(lens["f"]), lens
    f = tmp_path / "train_config.json"
    TrainConfig(stages=[short, full]).save(f)
    assert [s.synthetic_length for s in TrainConfig.load(f).stages] == [[0.3, 0.35], None]


def test_synthetic_draw_too_short_for_a_task_is_redrawn_longer() -> None:
    """Conflict items cannot be short: a range far below their minimum still yields valid documents."""
    from longmoe.train.mix import make_source

    tok = tokenizer_for_tests(512)
    src = make_source(
        "synthetic:conflict", "train", 0, tok, synthetic_length=768, synthetic_range=(0.05, 0.1)
    )
    docs = [src.next() for _ in range(3)]
    lens = [len(tok.encode(d.text)) + 2 for d in docs]  # + bos, eos
    assert all("\nAnswer: " in d.text for d in docs) and max(lens) < 768, lens
