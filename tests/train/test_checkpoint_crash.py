"""Training checkpoint safety: SIGKILL during a save (a real subprocess), a corrupt newest checkpoint on
resume (the run layout and the loader are tested in tests/test_checkpoint.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from longmoe import checkpoint as ckpt
from longmoe.runlog import read_metrics
from longmoe.train.pretrain import Trainer
from tests.helpers.train import small_model_config, small_train_config


def _train(run_dir, cfg_dir, *extra, fault=None):
    env = dict(os.environ)
    env.pop(ckpt.FAULT_ENV, None)
    if fault:
        env[ckpt.FAULT_ENV] = fault
    cmd = [sys.executable, "-m", "longmoe", "train", "--run-dir", str(run_dir), "--no-progress", "--no-plots"]
    cmd += ["--config", str(cfg_dir / "model.json"), "--train-config", str(cfg_dir / "train.json")]
    cmd += ["--tokenizer", str(cfg_dir / "tokenizer.json"), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def cfg_dir(tmp_path, tok):
    d = tmp_path / "cfg"
    d.mkdir()
    small_model_config().save(d / "model.json")
    small_train_config(ckpt_every=2).save(d / "train.json")
    tok.save(d / "tokenizer.json")
    return d


def test_sigkill_during_save_keeps_previous_checkpoint_and_resume_matches(tmp_path, cfg_dir):
    ref = _train(tmp_path / "ref", cfg_dir, "--max-steps", "6")
    assert ref.returncode == 0, ref.stderr
    killed = _train(tmp_path / "run", cfg_dir, "--max-steps", "6", fault="kill-in-save:4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the half-written step-4 checkpoint never became visible; step 2 is intact
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["step-00000002"]
    assert list((tmp_path / "run/checkpoints").glob(".tmp-step-00000004-*"))
    path, state = ckpt.load_latest(tmp_path / "run")
    assert path.name == "step-00000002" and state["step"] == 2
    resumed = _train(tmp_path / "run", cfg_dir, "--resume", "--max-steps", "6")
    assert resumed.returncode == 0, resumed.stderr
    assert not list((tmp_path / "run/checkpoints").glob(".tmp-*"))  # stale temporaries cleaned up
    key = lambda r: (r["step"], r["loss"], r["grad_norm"], r.get("val_loss"))
    assert [key(r) for r in read_metrics(tmp_path / "run")] == [
        key(r) for r in read_metrics(tmp_path / "ref")
    ]


def test_corrupt_newest_checkpoint_falls_back(tmp_path, mcfg, tok, caplog):
    tcfg = small_train_config(ckpt_every=2, keep_last=5)
    Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False, max_steps=6).fit()
    newest = tmp_path / "r/checkpoints/step-00000006/model.safetensors"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    newest.write_bytes(bytes(data))
    path, state = ckpt.load_latest(tmp_path / "r")
    assert path.name == "step-00000004" and state["step"] == 4
    assert "corrupt" in caplog.text
    tr = Trainer(tmp_path / "r", resume=True, progress=False)
    assert tr.step == 4
    (tmp_path / "r/checkpoints/step-00000004/COMPLETE").unlink()  # a save that never finished
    assert ckpt.load_latest(tmp_path / "r")[0].name == "step-00000002"
