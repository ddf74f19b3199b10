"""The trainer on 2 gloo ranks: the same logged losses as one process with the same global batch, and
sharded checkpoints that resume at another world size (2 -> 1, 1 -> 2) with the same losses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from longmoe import checkpoint as ckpt
from longmoe.data.tokenizer import Tokenizer
from longmoe.distributed.parallel_dims import ParallelDims
from longmoe.train.pretrain import Trainer
from tests.helpers.launch import run_ranks
from tests.helpers.tokenizer import tokenizer_for_tests
from tests.helpers.train import dist_model_config, dist_train_config, losses

STEPS = 5


def val_losses(run: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["val_loss"] for r in recs if "val_loss" in r}


def _fit(
    rank: int,
    world: int,
    run: str,
    tok_file: str,
    resume: bool,
    max_steps: int,
    dims: ParallelDims | None = None,
) -> None:
    tok = Tokenizer.from_file(tok_file)
    if resume:
        Trainer(run, resume=True, progress=False, max_steps=max_steps, dims=dims).fit()
    else:
        Trainer(
            run, dist_model_config(), dist_train_config(), tok, progress=False, max_steps=max_steps, dims=dims
        ).fit()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    tok = tokenizer_for_tests(512)
    tok.save(root / "tok.json")
    one = root / "one"
    Trainer(one, dist_model_config(), dist_train_config(), tok, progress=False, max_steps=STEPS).fit()
    two = root / "two"
    run_ranks(_fit, str(two), str(root / "tok.json"), False, STEPS)
    return {"root": root, "one": one, "two": two, "tok": root / "tok.json"}


def close(a: dict[int, float], b: dict[int, float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-5 for k in a)


def test_two_ranks_log_the_one_process_losses(runs):
    one, two = losses(runs["one"]), losses(runs["two"])
    assert sorted(two) == list(range(1, STEPS + 1))
    assert close(two, one), (two, one)
    assert close(val_losses(runs["two"]), val_losses(runs["one"]))  # stage-end validation too


def test_sharded_checkpoints_and_export(runs):
    two = runs["two"]
    step3 = ckpt.step_dir(two, 3)
    assert ckpt.is_sharded(step3) and ckpt.is_complete(step3)
    assert not list((two / ckpt.CKPT_DIR).glob(".tmp-*"))
    assert ckpt.resolve_model_dir(two) == two / "final"  # exported whole, loadable by serve/eval


def test_resume_two_ranks_into_one_process(runs):
    run = runs["root"] / "two-to-one"
    shutil.copytree(runs["two"], run)
    for d in ckpt.list_checkpoints(run):  # keep the step-3 checkpoint only
        if d.name != "step-00000003":
            shutil.rmtree(d)
    Trainer(run, resume=True, progress=False, max_steps=STEPS).fit()
    got = losses(run)
    assert close({k: got[k] for k in (4, 5)}, {k: losses(runs["two"])[k] for k in (4, 5)})


def test_resume_one_process_into_two_ranks(runs):
    run = runs["root"] / "one-to-two"
    Trainer(
        run,
        dist_model_config(),
        dist_train_config(),
        Tokenizer.from_file(runs["tok"]),
        progress=False,
        max_steps=3,
    ).fit()
    run_ranks(_fit, str(run), str(runs["tok"]), True, STEPS)
    got = losses(run)
    assert close({k: got[k] for k in (4, 5)}, {k: losses(runs["one"])[k] for k in (4, 5)})


@pytest.mark.parametrize("dims", [ParallelDims(1, 2, 1), ParallelDims(1, 1, 2)], ids=["ep=2", "cp=2"])
def test_expert_and_context_parallel_log_the_one_process_losses(runs, tmp_path, dims):
    """Expert parallel (each rank half the experts, its own windows) and context parallel (each rank
    half of every packed row) train like one process: losses of 3 steps and the stage-end validation."""
    run = tmp_path / "run"
    run_ranks(_fit, str(run), str(runs["tok"]), False, 3, dims)
    ref = losses(runs["one"])
    assert close(losses(run), {k: ref[k] for k in (1, 2, 3)}), (losses(run), ref)
    assert close(val_losses(run), {3: val_losses(runs["one"])[3]})
