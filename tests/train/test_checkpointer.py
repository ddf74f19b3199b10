"""The checkpointer: every part's state round-trips, a run directory of format 1 (before the
checkpointer) resumes to the same losses, a newer format is refused in one line, a schedule resumed
with another step budget is refused."""

from __future__ import annotations

import random
import shutil

import pytest
import torch

from longmoe import checkpoint as ckpt
from longmoe.data.stages import CurriculumStage
from longmoe.model import LongMoE
from longmoe.rl.trainer import ReferenceFingerprint
from longmoe.train.checkpointer import FORMAT_KEY, FORMAT_VERSION, RNG, Curve, Progress
from longmoe.train.config import TrainConfig
from longmoe.train.curriculum import Curriculum
from longmoe.train.optim import LRSchedule, ScheduleConfig, build_optimizer
from longmoe.train.pretrain import Trainer
from tests.helpers.train import losses


def test_progress_rng_schedule_and_data_round_trip(mcfg, tok):
    p = Progress(step=7, tokens=1234, skipped_steps=1)
    q = Progress()
    q.load_state_dict(p.state_dict())
    assert q == p

    rng = RNG()
    torch.manual_seed(3)
    random.seed(3)
    saved = rng.state_dict()
    want = (torch.rand(4), random.random())
    torch.manual_seed(99)
    random.seed(99)
    rng.load_state_dict(saved)
    assert torch.equal(torch.rand(4), want[0]) and random.random() == want[1]

    opt = build_optimizer(LongMoE(mcfg), 1e-3)
    a = LRSchedule(opt, ScheduleConfig(lr=1.0, warmup_steps=2), 10)
    for _ in range(5):
        a.advance()
    b = LRSchedule(opt, ScheduleConfig(lr=1.0, warmup_steps=2), 10)
    b.load_state_dict(a.state_dict())
    assert b.step == 5 and b.apply() == a.lr and opt.param_groups[0]["lr"] == a.lr

    stages = [CurriculumStage("a", window=32, tokens=32 * 2 * 3, batch_size=2)]
    c = Curriculum(stages, tok, seed=1)
    c.next_batch()
    d = Curriculum(stages, tok, seed=1)
    d.load_state_dict(c.state_dict())
    assert torch.equal(c.next_batch().input_ids, d.next_batch().input_ids)


def test_schedule_resumed_with_another_step_budget_is_refused(mcfg):
    opt = build_optimizer(LongMoE(mcfg), 1e-3)
    s = LRSchedule(opt, ScheduleConfig(lr=1.0), 10)
    with pytest.raises(ValueError, match="spans 10 steps, this run 12"):
        LRSchedule(opt, ScheduleConfig(lr=1.0), 12).load_state_dict(s.state_dict())


def test_reference_fingerprint_refuses_a_swapped_reference(tmp_path, model_dir):
    ref = tmp_path / "reference"
    shutil.copytree(model_dir, ref)
    state = ReferenceFingerprint(ref).state_dict()
    ReferenceFingerprint(ref).load_state_dict(state)  # the same weights: fine
    w = ref / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ckpt.CheckpointError, match="not the reference"):
        ReferenceFingerprint(ref).load_state_dict(state)


def _tcfg() -> TrainConfig:
    stages = [CurriculumStage("a", window=32, tokens=32 * 2 * 4, batch_size=2)]
    return TrainConfig(stages=stages, warmup_steps=1, eval_every=0, ckpt_every=2, val_windows=1)


def _rewrite_state(run, step, change) -> None:
    """Rewrite checkpoint ``step``'s trainer state through the one writer (new manifest, atomic)."""
    path = ckpt.step_dir(run, step)
    state = torch.load(path / ckpt.STATE_FILE, weights_only=True)
    model = LongMoE.from_pretrained(path)
    ckpt.save_checkpoint(run, step, model, path / ckpt.TOKENIZER_FILE, change(state), keep_last=3)


def test_state_file_holds_the_format_version_and_every_part(tmp_path, mcfg, tok):
    tr = Trainer(tmp_path / "r", mcfg, _tcfg(), tok, progress=False, max_steps=2)
    tr.fit()
    st = torch.load(ckpt.step_dir(tmp_path / "r", 2) / ckpt.STATE_FILE, weights_only=True)
    assert st[FORMAT_KEY] == FORMAT_VERSION
    assert {"step", "tokens", "skipped_steps", "optimizer", "rng", "curriculum", "schedule"} <= set(st)
    assert st["schedule"] == {"step": 2, "total": 4}


def test_a_format_1_run_directory_resumes_to_the_same_losses(tmp_path, mcfg, tok):
    """A checkpoint as every loop wrote it before the checkpointer (no version, no schedule part)."""
    Trainer(tmp_path / "full", mcfg, _tcfg(), tok, progress=False).fit()
    old = tmp_path / "old"
    Trainer(old, mcfg, _tcfg(), tok, progress=False, max_steps=2).fit()

    def to_v1(state):
        return {k: v for k, v in state.items() if k not in (FORMAT_KEY, "schedule")}

    _rewrite_state(old, 2, to_v1)
    assert FORMAT_KEY not in torch.load(ckpt.step_dir(old, 2) / ckpt.STATE_FILE, weights_only=True)
    tr = Trainer(old, resume=True, progress=False)
    assert tr.step == 2 and tr.schedule.step == 2
    tr.fit()
    assert losses(old) == losses(tmp_path / "full")


def test_a_newer_format_is_refused_in_one_line(tmp_path, mcfg, tok):
    run = tmp_path / "r"
    Trainer(run, mcfg, _tcfg(), tok, progress=False, max_steps=2).fit()
    _rewrite_state(run, 2, lambda s: {**s, FORMAT_KEY: FORMAT_VERSION + 1})
    with pytest.raises(
        ckpt.CheckpointError, match=rf"format_version {FORMAT_VERSION + 1}.*reads formats 1-2"
    ) as e:
        Trainer(run, resume=True, progress=False)
    assert "\n" not in str(e.value)


def test_curve_times_add_up_across_a_resume_and_an_older_state_loads():
    c = Curve()
    c.load_state_dict({"curve": [[1, 0.5]], "seconds": 10.0, "cpu_seconds": 7.0})
    st = c.state_dict()
    assert st["curve"] == [[1, 0.5]] and st["seconds"] >= 10.0 and st["cpu_seconds"] >= 7.0
    old = Curve()
    old.load_state_dict({"curve": [], "seconds": 3.0})  # saved before CPU time was kept
    assert 0.0 <= old.cpu_seconds < 3.0 and old.seconds >= 3.0
