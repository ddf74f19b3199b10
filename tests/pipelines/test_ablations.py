"""The ablations recipe: quick mode end to end, resume (a rerun trains nothing), the probes and models."""

from __future__ import annotations

import json
import math

import pytest
import torch

from longmoe.config import FFNConfig, ModelConfig
from longmoe.model import LongMoE
from longmoe.pipelines.ablations import __main__ as cli
from longmoe.pipelines.ablations import run as run_mod
from longmoe.pipelines.ablations.config import ARMS, STUDIES, AblationConfig, RunKey, run_keys
from longmoe.pipelines.ablations.models import match_params, model_for, n_params
from longmoe.pipelines.ablations.probes import DecayProbe, window_sums
from longmoe.pipelines.ablations.report import REPORT_MD, RESULTS_JSON
from longmoe.pipelines.ablations.result import RunResult, mean_se, paired_diff


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ablations")
    cfg = AblationConfig.quick()
    return cfg, out, run_mod.run_ablations(cfg, out)


def test_quick_mode_trains_every_arm_and_writes_the_report(quick_run):
    cfg, out, results = quick_run
    assert {(r.study, r.arm, r.seed) for r in results} == {(k.study, k.arm, k.seed) for k in run_keys(cfg)}
    for r in results:
        assert (out / r.study / f"{r.arm}-seed{r.seed}.json").is_file()
        assert r.steps == cfg.steps(r.study) and len(r.loss_curve) == r.steps
        assert r.tokens == r.steps * cfg.batch_size * cfg.window
        assert math.isfinite(r.val_loss)
    decay = [r for r in results if r.study == "decay"]
    assert all(len(r.min_gamma) == r.steps and len(r.max_abs_o) == r.steps for r in decay)
    assert all(g >= 16 * -5.0 for r in decay if r.arm.startswith("bounded") for g in r.min_gamma)
    balance = [r for r in results if r.study == "balance"]
    assert all(r.final_max_vio is not None and r.dead_experts is not None for r in balance)
    assert all(len(r.max_vio_curve) == r.steps for r in balance)
    md = (out / REPORT_MD).read_text()
    for title in ("stability in bf16", "plain residuals", f"E = {cfg.balance_experts}"):
        assert title in md
    assert "confirmed" in md
    checks = json.loads((out / RESULTS_JSON).read_text())["checks"]
    assert {c["study"] for c in checks} == set(STUDIES)
    assert all(c["verdict"] in ("confirmed", "not confirmed", "not measured at enough seeds") for c in checks)
    for study in STUDIES:
        assert (out / "figures" / f"{study}.png").is_file()


def test_rerun_reads_every_finished_run_back(quick_run, monkeypatch):
    cfg, out, results = quick_run

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(run_mod, "train_run", no_training)
    again = run_mod.run_ablations(cfg, out, report=False)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in results]


def test_rerun_retrains_a_run_with_changed_settings_and_a_missing_one(quick_run, monkeypatch, tmp_path):
    cfg, out, results = quick_run
    trained = []
    real = run_mod.train_run

    def counting(key, *args, **kwargs):
        trained.append(key)
        return real(key, *args, **kwargs)

    monkeypatch.setattr(run_mod, "train_run", counting)
    decay_only = AblationConfig.quick(studies=("decay",))
    (out / "decay" / "bounded-seed0.json").unlink()  # as if killed before it finished
    run_mod.run_ablations(decay_only, out, report=False)
    assert trained == [RunKey("decay", "bounded", 0)]
    trained.clear()
    longer = AblationConfig.quick(studies=("decay",), decay_steps=4)
    res = run_mod.run_ablations(longer, out, report=False)
    assert len(trained) == len(ARMS["decay"]) and all(r.steps == 4 for r in res)


def test_cli_help_and_bad_study(capsys):
    assert cli.main(["--help"]) == 0
    assert "--quick" in capsys.readouterr().out
    assert cli.main(["--studies", "nope", "--quick"]) == 2


def test_config_is_validated():
    with pytest.raises(ValueError, match="studies"):
        AblationConfig(studies=("decay", "x"))
    with pytest.raises(ValueError, match="decay_steps"):
        AblationConfig(decay_steps=0)
    with pytest.raises(ValueError, match="balance_top_k"):
        AblationConfig(balance_experts=4, balance_top_k=8)


def test_plain_arm_matches_the_attnres_parameter_count():
    cfg = AblationConfig()
    for depth in ("tiny", "deep"):
        a = model_for(RunKey("attnres", f"attnres-{depth}", 0), cfg, 512)
        p = model_for(RunKey("attnres", f"plain-{depth}", 0), cfg, 512)
        assert a.attn_res and not p.attn_res
        per_unit = 3 * p.d_model * p.n_layers
        assert abs(n_params(a) - n_params(p)) <= per_unit / 2
        assert p.ffn.dense_hidden > a.ffn.dense_hidden
    with pytest.raises(ValueError, match="dense"):
        match_params(ModelConfig(ffn=FFNConfig(kind="moe")), 10)


def test_model_arms_differ_only_in_the_ablated_choice():
    cfg = AblationConfig()
    b, s = (model_for(RunKey("decay", a, 0), cfg, 512) for a in ("bounded", "softplus-hot"))
    assert (b.kda_gate, s.kda_gate) == ("bounded", "softplus")
    assert b.replace(kda_gate="softplus") == s
    m = {a: model_for(RunKey("balance", a, 0), cfg, 512) for a in ARMS["balance"]}
    assert {c.ffn.balancer for c in m.values()} == set(ARMS["balance"])
    assert all(c.ffn.n_experts == 256 for c in m.values())


def test_window_sums_and_probe():
    g = torch.arange(1.0, 21.0).view(1, 20, 1, 1)
    s = window_sums(g, 16)
    assert s.shape == (1, 5, 1, 1) and s[0, 0].item() == sum(range(1, 17))
    assert window_sums(g[:, :5], 16)[0, 0].item() == 15.0  # shorter than a chunk: the whole sum
    cfg = model_for(RunKey("decay", "softplus", 0), AblationConfig(), 64)
    model = LongMoE(cfg)
    probe = DecayProbe(model)
    x = torch.randint(0, 64, (1, 40))
    model.train()
    model(x)
    model(x)
    model.eval()
    model(x)  # evaluation forwards are not recorded
    probe.close()
    assert len(probe.min_gamma) == 2 and len(probe.max_abs_o) == 2
    assert all(g < 0 for g in probe.min_gamma) and all(o > 0 for o in probe.max_abs_o)
    model(x)
    assert len(probe.min_gamma) == 2  # hooks removed


def test_summary_statistics():
    m, se = mean_se([1.0, 2.0, 3.0])
    assert m == 2.0 and se == pytest.approx(1 / math.sqrt(3))
    assert math.isnan(mean_se([1.0])[1])
    mk = lambda seed, v: RunResult("s", "a", seed, {}, 1, 1, 1, 0.0, v, [v])
    d, se, n = paired_diff([mk(0, 1.0), mk(1, 2.0)], [mk(1, 1.5), mk(0, 0.5)], "val_loss")
    assert (d, se, n) == (0.5, 0.0, 2)


def test_arms_filter_splits_a_study():
    cfg = AblationConfig.quick(studies=("attnres",), arms=("plain-deep",))
    assert [k.arm for k in run_keys(cfg)] == ["plain-deep"] * cfg.attnres_seeds
    with pytest.raises(ValueError, match="arms"):
        AblationConfig(studies=("decay",), arms=("quantile",))


def test_balancer_loss_cost_needs_five_paired_seeds():
    from longmoe.pipelines.ablations.report import BALANCE_MIN_SEEDS
    from longmoe.pipelines.ablations.result import Check

    assert AblationConfig().balance_seeds >= BALANCE_MIN_SEEDS == 5
    assert Check("balance", "x", True, "", enough_seeds=False).verdict == "not measured at enough seeds"
