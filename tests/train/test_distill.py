"""Draft distillation (longmoe/train/distill.py): the draft moves towards the target's distribution,
the target is never written, bad settings are named, and a run directory makes an interrupted
distillation resume to what an uninterrupted one gives."""

from __future__ import annotations

import pytest
import torch

from longmoe.errors import UserError
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.speculative import truncated_draft
from longmoe.train import distill as distill_module
from longmoe.train.distill import DistillConfig, distill, forward_kl


def test_forward_kl_is_zero_for_equal_logits_and_positive_otherwise():
    a = torch.randn(3, 5, 11)
    assert float(forward_kl(a, a)) == pytest.approx(0.0, abs=1e-6)
    assert float(forward_kl(a, torch.randn(3, 5, 11))) > 0.01


def test_distillation_lowers_the_kl_and_leaves_the_target_alone():
    torch.manual_seed(0)
    target = LongMoE(preset("tiny").replace(n_layers=4, layer_pattern="LLLM", attn_res_blocks=2)).eval()
    with torch.no_grad():  # off init, so the target's distribution is not near-uniform
        for p in target.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    draft = truncated_draft(target, 1)
    tokens = torch.randint(3, 2048, (96,), generator=torch.Generator().manual_seed(0))
    window = tokens[None, :64]  # the windows overlap: a property of the optimisation, not of data

    def kl() -> float:
        with torch.no_grad():
            return float(forward_kl(target(window).logits, draft(window).logits))

    start = kl()
    distill(target, draft, tokens, DistillConfig(steps=30, batch=4, seq_len=64, lr=3e-3))
    assert kl() < 0.8 * start, (start, kl())
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in before.items())
    assert not draft.training


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"steps": 0}, "distill.steps"), ({"seq_len": 1.5}, "distill.seq_len"), ({"lr": 0}, "lr")],
)
def test_bad_settings_are_named(kw, match):
    with pytest.raises(ValueError, match=match):
        DistillConfig(**kw)


def test_too_few_tokens_is_an_error():
    m = LongMoE(preset("tiny"))
    with pytest.raises(ValueError, match="fewer than one window"):
        distill(m, truncated_draft(m, 1), torch.arange(10), DistillConfig(seq_len=64))


def _target() -> LongMoE:
    torch.manual_seed(0)
    return LongMoE(preset("tiny").replace(n_layers=2, layer_pattern="LM", attn_res_blocks=2)).eval()


class Interrupted(Exception):
    pass


def test_an_interrupted_run_resumes_to_the_uninterrupted_losses_and_weights(tmp_path, monkeypatch):
    target = _target()
    tokens = torch.randint(3, 2048, (80,), generator=torch.Generator().manual_seed(0))
    cfg = DistillConfig(steps=6, batch=2, seq_len=16, lr=3e-3, checkpoint_every=2)
    whole = truncated_draft(target, 1)
    expected = distill(target, whole, tokens, cfg)

    calls = []

    def dies_at_step_5(p, q):  # after the step-4 checkpoint, before step 5's update
        calls.append(1)
        if len(calls) == 5:
            raise Interrupted
        return forward_kl(p, q)

    monkeypatch.setattr(distill_module, "forward_kl", dies_at_step_5)
    with pytest.raises(Interrupted):
        distill(target, truncated_draft(target, 1), tokens, cfg, run_dir=tmp_path / "run")
    calls.clear()
    monkeypatch.setattr(distill_module, "forward_kl", lambda p, q: calls.append(1) or forward_kl(p, q))
    resumed = truncated_draft(target, 1)  # a new process: the draft starts from the cut again
    assert distill(target, resumed, tokens, cfg, run_dir=tmp_path / "run") == expected
    assert len(calls) == 2, "the resumed run trains steps 4 and 5 only"
    assert all(torch.equal(v, whole.state_dict()[k]) for k, v in resumed.state_dict().items())
    again = truncated_draft(target, 1)  # a finished run loads its last checkpoint and trains no further
    assert distill(target, again, tokens, cfg, run_dir=tmp_path / "run") == expected and len(calls) == 2
    assert all(torch.equal(v, whole.state_dict()[k]) for k, v in again.state_dict().items())


def test_a_run_refuses_other_settings_in_one_line(tmp_path):
    target = _target()
    tokens = torch.arange(3, 60)
    cfg = DistillConfig(steps=1, batch=1, seq_len=8)
    distill(target, truncated_draft(target, 1), tokens, cfg, run_dir=tmp_path)
    other = DistillConfig(steps=1, batch=1, seq_len=8, lr=0.5)
    with pytest.raises(
        UserError, match=r"^distill differs from the run's .*distill_config.json in distill.lr "
    ):
        distill(target, truncated_draft(target, 1), tokens, other, run_dir=tmp_path)
