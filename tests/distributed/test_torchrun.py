"""``torchrun --nproc-per-node 2 -m longmoe train``: a 2-step run, a layout that does not fit the world,
and a rank SIGKILLed inside a sharded save (the previous checkpoint survives; the run resumes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from longmoe import checkpoint as ckpt
from tests.helpers.launch import free_port
from tests.helpers.tokenizer import tokenizer_for_tests
from tests.helpers.train import dist_model_config, dist_train_config, losses


def torchrun(
    run_dir: Path, cfg_dir: Path, *extra: str, fault: str | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != ckpt.FAULT_ENV}
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env[ckpt.FAULT_ENV] = fault
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(free_port()), "-m", "longmoe", "train", "--run-dir", str(run_dir), "--no-progress",
           "--no-plots",
           "--config", str(cfg_dir / "model.json"), "--train-config", str(cfg_dir / "train.json"),
           "--tokenizer", str(cfg_dir / "tokenizer.json"), *extra]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cfg_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    dist_model_config().save(d / "model.json")
    dist_train_config().save(d / "train.json")
    tokenizer_for_tests(512).save(d / "tokenizer.json")
    return d


def test_torchrun_two_processes_two_steps(tmp_path, cfg_dir):
    r = torchrun(tmp_path / "run", cfg_dir, "--max-steps", "2", "--dp-shard", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(losses(tmp_path / "run")) == [1, 2]
    assert ckpt.is_sharded(ckpt.step_dir(tmp_path / "run", 2))
    assert (tmp_path / "run/final/model.safetensors").is_file()


def test_torchrun_layout_must_fit_the_world(tmp_path, cfg_dir):
    r = torchrun(tmp_path / "run", cfg_dir, "--max-steps", "1", "--dp-shard", "3")
    assert r.returncode != 0
    assert "--dp-shard 3" in r.stderr and "world size is 2" in r.stderr


@pytest.mark.slow(wall="~40 s on 2 shared cores (two launches)")
def test_sigkill_in_sharded_save_keeps_previous_checkpoint(tmp_path, cfg_dir):
    run = tmp_path / "run"
    r = torchrun(run, cfg_dir, "--max-steps", "4", "--ckpt-every", "2", fault="kill-in-save:4")
    assert r.returncode != 0
    assert [p.name for p in ckpt.list_checkpoints(run)] == ["step-00000002"]
    assert ckpt.load_latest(run)[0].name == "step-00000002"
    r = torchrun(run, cfg_dir, "--max-steps", "4", "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(losses(run)) == [1, 2, 3, 4]
    assert ckpt.load_latest(run)[0].name == "step-00000004"
    assert not list((run / ckpt.CKPT_DIR).glob(".tmp-*"))
