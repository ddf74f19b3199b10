"""The clipped policy loss on hand numbers, KL = 0 when the policy is the reference, masks, norms, the
truncated importance-sampling (TIS) weights."""

from __future__ import annotations

import math

import pytest
import torch

from longmoe.rl.loss import k3, policy_loss, tis_weights


def test_ppo_clip_hand_numbers():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 1.5]]))  # ratios 1.5, 0.5, 1.1, 1.5
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    out = policy_loss(logp, old, None, adv, mask, clip_low=0.2, clip_high=0.2)
    # per token -min(r A, clip(r) A): A>0 r=1.5 -> -1.2 (clipped); A>0 r=0.5 -> -0.5 (unclipped min);
    # A<0 r=1.1 -> 1.1; A<0 r=1.5 -> 1.5 (unclipped: min(-1.5, -1.2) = -1.5)
    assert float(out.loss) == pytest.approx((-1.2 - 0.5 + 1.1 + 1.5) / 4, abs=1e-6)
    assert out.clip_frac == pytest.approx(0.25)  # only the first token's gradient is clipped away
    logp.requires_grad_(True)
    policy_loss(logp, old, None, adv, mask).loss.backward()
    g = logp.grad[0]
    assert g[0] == 0.0 and g[1] != 0 and g[2] != 0 and g[3] != 0


def test_asymmetric_clip():
    old, logp = torch.zeros(1, 1), torch.log(torch.tensor([[1.5]]))
    out = policy_loss(logp, old, None, torch.ones(1, 1), torch.ones(1, 1), clip_low=0.2, clip_high=0.28)
    assert float(out.loss) == pytest.approx(-1.28)


def test_kl_zero_when_policy_is_reference_and_positive_otherwise():
    logp = torch.log_softmax(torch.randn(2, 5, 7), -1)[..., 0]
    assert torch.all(k3(logp, logp) == 0)
    mask = torch.ones(2, 5)
    out = policy_loss(logp, logp, logp, torch.zeros(2, 5), mask, kl_coef=1.0)
    assert out.kl == 0.0 and float(out.loss) == 0.0 and out.ratio == pytest.approx(1.0)
    other = logp + 0.3
    assert torch.all(k3(other, logp) > 0)
    d = -0.3
    assert float(k3(other, logp)[0, 0]) == pytest.approx(math.exp(d) - d - 1, abs=1e-6)


def test_masked_tokens_contribute_nothing():
    logp = torch.randn(2, 6, requires_grad=True)
    old = logp.detach() + torch.randn(2, 6) * 0.1
    ref = logp.detach() - 0.2
    adv = torch.randn(2, 6)
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    out = policy_loss(logp, old, ref, adv, mask, kl_coef=0.5)
    out.loss.backward()
    assert torch.all(logp.grad[~mask] == 0) and torch.all(logp.grad[mask] != 0)
    # changing anything under the mask leaves the loss unchanged
    logp2 = logp.detach().clone()
    logp2[~mask] += 5.0
    out2 = policy_loss(logp2, old, ref, adv * torch.where(mask, 1.0, 9.0), mask, kl_coef=0.5)
    assert float(out2.loss) == pytest.approx(float(out.loss.detach()), abs=1e-6)


def test_token_vs_sequence_normalisation():
    logp = torch.zeros(2, 4)
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
    tok = policy_loss(logp, logp, None, adv, mask, norm="token")
    seq = policy_loss(logp, logp, None, adv, mask, norm="sequence")
    assert float(tok.loss) == pytest.approx((-3 + 1) / 4)  # every policy token weighs the same
    assert float(seq.loss) == pytest.approx((-1 + 1) / 2)  # every trajectory weighs the same
    with pytest.raises(ValueError, match="norm"):
        policy_loss(logp, logp, None, adv, mask, norm="batch")


def test_tis_weighted_loss_equals_hand_computation_and_cap_applies():
    old = torch.log(torch.tensor([[0.5, 0.2, 0.4, 0.3]]))  # the trainer's log-probs before the update
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.4, 0.05]]))  # the engine's (sampling) log-probs
    w = tis_weights(old, rollout, cap=2.0)
    # π_old / π_rollout = 2, 0.5, 1, 6 -> capped at 2
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 1.0, 2.0]]))
    assert float(w[0, 3]) == 2.0  # exactly the cap
    logp = old + torch.log(torch.tensor([[1.5, 1.0, 0.5, 1.1]]))  # ratios to π_old 1.5, 1, 0.5, 1.1
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    out = policy_loss(logp, old, None, adv, mask, clip_low=0.2, clip_high=0.2, tis=w)
    # -min(ρA, clip(ρ)A) per token: -1.2, 1.0, -0.5, 1.1; times w: -2.4, 0.5, -0.5, 2.2
    assert float(out.loss) == pytest.approx((-2.4 + 0.5 - 0.5 + 2.2) / 4, abs=1e-6)
    assert out.tis == pytest.approx(5.5 / 4)
    high = tis_weights(old, rollout, cap=10.0)
    assert float(high[0, 3]) == pytest.approx(6.0)  # a higher cap lets the weight through
    with pytest.raises(ValueError, match="cap"):
        tis_weights(old, rollout, cap=0.0)


def test_tis_weights_exactly_one_when_logprobs_bitwise_equal():
    lp = torch.log_softmax(torch.randn(3, 6, 11), -1)[..., 0]
    w = tis_weights(lp, lp.clone(), cap=2.0)
    assert torch.equal(w, torch.ones_like(lp))
    logp = (lp + 0.01 * torch.randn_like(lp)).requires_grad_(True)
    adv, mask = torch.randn(3, 6), torch.rand(3, 6) > 0.3
    a = policy_loss(logp, lp, lp, adv, mask, kl_coef=0.1, tis=w)
    b = policy_loss(logp, lp, lp, adv, mask, kl_coef=0.1)
    assert torch.equal(a.loss, b.loss) and a.tis == 1.0  # the correction is then a no-op, bit for bit
