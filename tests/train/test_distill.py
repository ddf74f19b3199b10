"""Draft distillation (longmoe/train/distill.py): the draft moves towards the target's distribution,
the target is never written, and bad settings are named."""

from __future__ import annotations

import pytest
import torch

from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.speculative import truncated_draft
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
