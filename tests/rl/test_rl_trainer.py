"""The RL trainer on a fake environment: a step runs end to end and logs its metrics; KL is 0 at the
first step (policy = reference); the token tensors shift masks and advantages correctly; a run
interrupted and resumed ends with the same weights, optimizer and log as an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from longmoe.agent.rollout import Trajectory, TurnRecord
from longmoe.checkpoint import METRICS, list_checkpoints
from longmoe.model import WEIGHTS_FILE
from longmoe.rl.config import RLConfig, rl_engine_config
from longmoe.rl.trainer import RLTrainer, token_tensors
from tests.helpers.agent import FakeEnv


def config(init: Path, **kw) -> RLConfig:
    base = dict(
        init=str(init), steps=3, tasks_per_step=2, group_size=3, max_turn_tokens=8,
        max_episode_tokens=256, lr=1e-3, micro_batch=4, minibatches=2, ckpt_every=1, kl_coef=0.1,
    )  # fmt: skip
    return RLConfig(**{**base, **kw})


def fake(h: int) -> FakeEnv:
    return FakeEnv(turns=h + 1)


def test_token_tensors_shift_masks_and_advantages():
    t = Trajectory(0, 0, 0, 1, ids=[1, 2, 3, 4, 5, 6, 7], policy_mask=[0, 0, 1, 1, 0, 1, 1],
                   logprobs=[0, 0, -0.5, -0.25, 0, -1.0, -2.0])  # fmt: skip
    t.turns = [TurnRecord(2, 4, "a"), TurnRecord(5, 7, "b")]
    m = token_tensors([t], [[0.5, -1.0]])
    assert m["mask"][0].tolist() == [False, True, True, False, True, True]
    assert m["old_logp"][0].tolist() == [0, -0.5, -0.25, 0, -1.0, -2.0]
    assert m["adv"][0].tolist() == [0, 0.5, 0.5, 0, -1.0, -1.0]


def test_steps_log_metrics_kl_starts_at_zero_and_rollouts_use_the_updated_policy(model_dir, tmp_path):
    tr = RLTrainer(tmp_path / "run", config(model_dir, steps=2, minibatches=1), env_factory=fake)
    tr.fit()
    first, rec = [json.loads(ln) for ln in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the first update starts at the reference
    assert first["ratio"] == pytest.approx(1.0, abs=1e-2)  # rollout logprobs = the policy's
    assert rec["step"] == 2 and 0.0 <= rec["reward"] <= 1.0 and rec["turns"] == pytest.approx(3.0)
    assert rec["kl"] > 1e-6  # the policy has moved away from the reference ...
    assert rec["ratio"] == pytest.approx(1.0, abs=1e-2)  # ... and the engine sampled from the moved one
    assert "drift_changed_mean" in rec and rec["rollout_tok_s"] > 0
    assert 0.0 <= rec["mismatch_mean"] <= rec["mismatch_max"] < 1e-3  # engine vs trainer log-probs
    assert (tmp_path / "run" / "final" / WEIGHTS_FILE).exists()


def test_resume_equals_uninterrupted(model_dir, tmp_path):
    # one episode in the engine at a time: the batch composition (and so the last bits of the rollout
    # logprobs) is then the same in both runs, and the weights can be compared exactly; two steps, one
    # task each: the second runs after the resume
    cfg = dict(steps=2, tasks_per_step=1, engine=rl_engine_config(max_batch=1))
    a = tmp_path / "a"
    RLTrainer(a, config(model_dir, **cfg), env_factory=fake).fit()
    b = tmp_path / "b"
    RLTrainer(b, config(model_dir, **cfg), max_steps=1, env_factory=fake).fit()  # checkpoint at 1
    assert [p.name for p in list_checkpoints(b)][-1] == "step-00000001"
    with open(b / METRICS, "a") as f:
        f.write(json.dumps({"step": 2, "stale": True}) + "\n")  # a line the crashed run wrote after
    RLTrainer(b, resume=True, env_factory=fake).fit()
    wa, wb = load_file(str(a / "final" / WEIGHTS_FILE)), load_file(str(b / "final" / WEIGHTS_FILE))
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    ra = [json.loads(ln) for ln in (a / METRICS).read_text().splitlines()]
    rb = [json.loads(ln) for ln in (b / METRICS).read_text().splitlines()]
    drop = ("rollout_s", "update_s", "rollout_tok_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in ra] == [
        {k: v for k, v in r.items() if k not in drop} for r in rb
    ]
    assert len(ra) == 2 and (ra[0]["reward"] != ra[-1]["reward"] or ra[0]["kl"] != ra[-1]["kl"])  # it trained


def test_frozen_router_does_not_drift(model_dir, tmp_path):
    cfg = config(model_dir, steps=2, freeze_router=True, lr=5e-3)
    tr = RLTrainer(tmp_path / "run", cfg, env_factory=fake)
    before = [m.router.weight.detach().clone() for m in tr.policy.moe_layers()]
    bias = [m.bias.clone() for m in tr.policy.moe_layers()]
    tr.fit()
    for m, w, b in zip(tr.policy.moe_layers(), before, bias, strict=True):
        assert torch.equal(m.router.weight, w) and torch.equal(m.bias, b)


class NoRewardEnv(FakeEnv):
    def step(self, turn):
        res = super().step(turn)
        res.reward = 0.0
        return res


def test_no_signal_no_step(model_dir, tmp_path):
    """Every group's rewards equal and the policy at the reference: nothing to learn, so the weights
    stay exactly as they were (Adam would otherwise take a full step on rounding noise), and so does
    the balancing bias (moving it would change the routing with no signal)."""
    cfg = config(model_dir, steps=1, minibatches=2)
    tr = RLTrainer(tmp_path / "run", cfg, env_factory=lambda h: NoRewardEnv(turns=2))
    before = {k: v.clone() for k, v in tr.policy.named_parameters()}
    bias = [m.bias.clone() for m in tr.policy.moe_layers()]
    rec = tr.fit()
    assert rec["skipped_updates"] == 2 and rec["adv_abs"] == 0.0
    for k, v in tr.policy.named_parameters():
        assert torch.equal(v, before[k]), k
    for m, b in zip(tr.policy.moe_layers(), bias, strict=True):
        assert torch.equal(m.bias, b)


def test_tis_ratio_is_exactly_one_at_the_first_update_and_weights_one_on_equal_logprobs(model_dir, tmp_path):
    # one micro-batch, one minibatch: the PPO ratio is taken against the trainer's own forward, so the
    # first (only) update sees ρ = 1 bit for bit, whatever the engine's last bits were
    tr = RLTrainer(
        tmp_path / "run", config(model_dir, steps=1, minibatches=1, micro_batch=8), env_factory=fake
    )
    try:
        trajs = tr.rollouts()
        advs = tr.advantages(trajs)
        micro = [token_tensors(trajs, advs)]
        trainer = tr.trainer_logprobs(micro)[0]
        mask = micro[0]["mask"]
        for t, row in zip(trajs, trainer, strict=True):  # the rollout log-probs := the trainer's, bitwise
            t.logprobs = [0.0] + row[: len(t.ids) - 1].tolist()
        assert all(float(layer.step_counts.sum()) == 0 for layer in tr.policy.moe_layers())  # discarded
        rec = tr.update(trajs, advs)
        assert rec["ratio"] == 1.0 and rec["tis"] == 1.0 and rec["tis_capped"] == 0.0
        assert rec["mismatch_max"] == 0.0 and rec["mismatch_mean"] == 0.0 and bool(mask.any())
    finally:
        tr.close()


def test_tis_off_takes_the_ratio_against_the_rollout_logprobs(model_dir, tmp_path):
    tr = RLTrainer(
        tmp_path / "run",
        config(model_dir, steps=1, minibatches=1, micro_batch=8, tis_cap=None),
        env_factory=fake,
    )
    try:
        trajs = tr.rollouts()
        for t in trajs:  # rollout log-probs 0.1 above the truth: ratio e^{-0.1} on policy tokens
            t.logprobs = [lp + 0.1 if m else 0.0 for lp, m in zip(t.logprobs, t.policy_mask, strict=True)]
        rec = tr.update(trajs, tr.advantages(trajs))
        assert rec["ratio"] == pytest.approx(0.9048, abs=1e-3) and rec["tis"] == 1.0
        assert rec["mismatch_mean"] == pytest.approx(0.1, abs=1e-3)
    finally:
        tr.close()
