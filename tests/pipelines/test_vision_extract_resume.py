"""The vision_extract recipe resumes from ``ckpt.pt`` loaded as data (``weights_only=True``): a real
checkpoint resumes, a crafted one runs no code."""

from __future__ import annotations

import pickle

import pytest
import torch

from longmoe.pipelines.vision_extract.config import quick
from longmoe.pipelines.vision_extract.data import char_tokenizer
from longmoe.pipelines.vision_extract.train import LEGACY_CKPT as CKPT
from longmoe.pipelines.vision_extract.train import RECIPE_BETAS, build_model, train_extractor
from longmoe.train.optim import build_optimizer

RAN: list[str] = []


def _payload() -> None:
    RAN.append("code from a checkpoint file ran")


class Crafted:
    def __reduce__(self):
        return (_payload, ())


def test_checkpoint_with_model_and_optimizer_state_resumes(tmp_path):
    rc, out = quick(), tmp_path / "main"
    model = build_model(rc)
    opt = build_optimizer(model, rc.lr, rc.weight_decay, betas=RECIPE_BETAS)
    model.embed.weight.pow(2).sum().backward()
    opt.step()  # the optimizer holds state (moments, step counts) as a real checkpoint's does
    curve = [[rc.steps, 1.5, 0.25]]
    state = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "step": rc.steps,
        "curve": curve,
        "seconds": 2.0,
    }
    out.mkdir()
    torch.save(state, out / CKPT)
    logs: list[str] = []
    resumed, run = train_extractor(rc, char_tokenizer(), out, "image", logs.append)
    assert f"main: resuming at step {rc.steps}" in logs and run.curve == curve and run.steps == rc.steps
    assert torch.equal(resumed.embed.weight, model.embed.weight)


def test_crafted_checkpoint_runs_no_code(tmp_path):
    out = tmp_path / "main"
    out.mkdir()
    torch.save({"model": Crafted()}, out / CKPT)
    with pytest.raises(pickle.UnpicklingError):
        train_extractor(quick(), char_tokenizer(), out, "image", lambda _m: None)
    assert not RAN
