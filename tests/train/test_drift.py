"""Routing drift on hand cases (identical routing -> 0, disjoint -> 1, load TV), on real models
(a copy drifts 0, a perturbed router drifts > 0), and the router freeze (parameters unchanged)."""

from __future__ import annotations

import copy

import torch

from longmoe.data.stages import CurriculumStage
from longmoe.model import LongMoE
from longmoe.train.drift import (
    changed_share,
    freeze_routing,
    load_histogram,
    measure_drift,
    routing_choices,
    routing_drift,
)
from longmoe.train.optim import param_groups
from longmoe.train.pretrain import Trainer
from tests.helpers.train import small_model_config, small_train_config

E = 4


def test_changed_share_hand_cases() -> None:
    """Order inside the top-k set does not matter; one of two swapped -> 0.5; disjoint -> 1."""
    ref = torch.tensor([[0, 1], [2, 3], [0, 1], [0, 1]])
    cur = torch.tensor([[1, 0], [2, 0], [2, 3], [0, 1]])
    assert changed_share(cur, ref, E).tolist() == [0.0, 0.5, 1.0, 0.0]


def test_load_histogram_and_total_variation() -> None:
    ref = [torch.tensor([[0, 1], [0, 1]])]  # load (0.5, 0.5, 0, 0)
    cur = [torch.tensor([[2, 3], [0, 1]])]  # load (0.25, 0.25, 0.25, 0.25)
    assert load_histogram(ref[0], E).tolist() == [0.5, 0.5, 0.0, 0.0]
    d = routing_drift(cur, ref, E)
    assert d.changed == [0.5] and d.load_tv == [0.5]
    assert routing_drift(ref, ref, E).changed == [0.0] and routing_drift(ref, ref, E).load_tv == [0.0]
    masked = routing_drift(cur, ref, E, token_mask=torch.tensor([False, True]))  # only the unchanged token
    assert masked.changed == [0.0] and masked.load_tv == [0.0]
    rec = d.record()
    assert rec["drift_changed"] == [0.5] and rec["drift_changed_mean"] == 0.5


def test_a_permutation_moves_choices_but_a_balanced_load_stays() -> None:
    """Every token moved to other experts, each expert as busy as before: changed 1, load TV 0."""
    ref = torch.tensor([[0, 1], [2, 3]])
    cur = torch.tensor([[2, 3], [0, 1]])
    d = routing_drift([cur], [ref], E)
    assert d.changed == [1.0] and d.load_tv == [0.0]


def _batch(cfg) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, cfg.vocab_size, (1, 48), generator=g)  # input_ids [1, 48]


def test_identical_models_have_zero_drift_and_a_changed_router_does_not() -> None:
    cfg = small_model_config()
    torch.manual_seed(0)
    model = LongMoE(cfg)
    batch = _batch(cfg)
    d = measure_drift(model, copy.deepcopy(model), batch)
    n_moe = len(model.moe_layers())
    assert n_moe > 0 and d.changed == [0.0] * n_moe and d.load_tv == [0.0] * n_moe
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.moe_layers()[-1].router.weight.mul_(-1.0)  # reverse the last router's preferences
    d2 = measure_drift(other, model, batch)
    assert d2.changed[-1] > 0.5 and d2.changed[:-1] == [0.0] * (n_moe - 1)


def test_choices_match_the_layers_own_routing() -> None:
    """The hook's recorded ids are the ones the layer used: ``[tokens, top_k]`` per MoE layer."""
    cfg = small_model_config()
    torch.manual_seed(1)
    model = LongMoE(cfg).train()
    choices = routing_choices(model, _batch(cfg))
    assert model.training  # the mode is restored
    assert len(choices) == len(model.moe_layers())
    for c in choices:
        assert c.shape == (48, cfg.ffn.top_k) and int(c.max()) < cfg.ffn.n_experts
    with torch.no_grad():  # the balancer's counts of a training forward are the recorded choices
        for m in model.moe_layers():
            m.step_counts.zero_()
        model(_batch(cfg))
    for m, c in zip(model.moe_layers(), choices):
        counts = torch.bincount(c.reshape(-1), minlength=cfg.ffn.n_experts).float()
        assert m.step_counts.tolist() == counts.tolist()


def test_freeze_routing_leaves_router_and_bias_out_of_training() -> None:
    model = LongMoE(small_model_config())
    freeze_routing(model)
    frozen = {id(m.router.weight) for m in model.moe_layers()}
    in_opt = {id(p) for g in param_groups(model, 0.1) for p in g["params"]}
    assert frozen and not frozen & in_opt


def _router_state(model: LongMoE) -> list[torch.Tensor]:
    return [t.detach().clone() for m in model.moe_layers() for t in (m.router.weight, m.bias)]


def test_frozen_router_and_bias_are_unchanged_after_training_steps(tmp_path, tok) -> None:
    """With ``freeze_router`` the routers and biases stay bit-identical while the experts learn;
    without it both move (the balancer shifts the bias, the optimizer the router)."""
    stages = [CurriculumStage("a", window=32, tokens=32 * 2 * 2, batch_size=2)]
    moved = {}
    for frozen in (True, False):
        tcfg = small_train_config(stages=stages, freeze_router=frozen, ckpt_every=0, eval_every=0, lr=1e-2)
        tr = Trainer(tmp_path / str(frozen), small_model_config(), tcfg, tok, progress=False)
        before = _router_state(tr.model)
        experts = [m.w_in.detach().clone() for m in tr.model.moe_layers()]
        for _ in range(2):
            tr.train_step()
        after = _router_state(tr.model)
        moved[frozen] = [not torch.equal(a, b) for a, b in zip(before, after)]
        assert any(not torch.equal(a, m.w_in) for a, m in zip(experts, tr.model.moe_layers()))
    assert not any(moved[True])
    assert all(moved[False])
