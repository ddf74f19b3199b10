"""Trainer: schedule, param groups, learning, exact resume, plots, clear errors."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from longmoe.accounting import param_counts
from longmoe.checkpoint import CheckpointError
from longmoe.config import ConfigError
from longmoe.data.corpus import DataError
from longmoe.data.stages import CurriculumStage
from longmoe.memory import check_memory, training_memory
from longmoe.presets import preset
from longmoe.runlog import read_metrics
from longmoe.train.config import TrainConfig
from longmoe.train.optim import lr_at, param_groups
from longmoe.train.plots import render
from longmoe.train.pretrain import Trainer
from longmoe.train.run import config_differences
from tests.helpers.train import small_train_config


def losses(run_dir):
    return [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(run_dir)]


def test_lr_schedules():
    cfg = TrainConfig(lr=1.0, min_lr_ratio=0.1, warmup_steps=10, schedule="cosine")
    lrs = [lr_at(s, cfg, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # monotone decay after warmup
    assert lrs[-1] == pytest.approx(0.1, abs=1e-3)
    wsd = TrainConfig(lr=1.0, min_lr_ratio=0.0, warmup_steps=0, schedule="wsd", wsd_decay_fraction=0.2)
    w = [lr_at(s, wsd, 100) for s in range(101)]
    assert (
        w[50] == 1.0
        and w[79] == 1.0
        and w[90] == pytest.approx(0.5, abs=0.02)
        and w[100] == pytest.approx(0.0, abs=1e-12)
    )


def test_no_weight_decay_on_norms_gates_biases(mcfg):
    from longmoe.model import LongMoE

    m = LongMoE(mcfg)
    decay, no_decay = param_groups(m, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    nd = {names[id(p)] for p in no_decay["params"]}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.1
    assert "final_norm.weight" in nd and "blocks.0.mixer.A" in nd and "blocks.0.mixer.gate_up.bias" in nd
    assert "blocks.0.mixer.gate_up.weight" in nd and "attn_res.queries" in nd
    d = {names[id(p)] for p in decay["params"]}
    assert "embed.weight" in d and "blocks.1.ffn.w_in" in d and "blocks.0.mixer.o_proj.weight" in d
    assert len(d) + len(nd) == len(names)


def test_twenty_steps_lower_the_loss(tmp_path, mcfg, tok):
    stages = [CurriculumStage("a", window=64, tokens=64 * 4 * 20, batch_size=4)]
    tcfg = TrainConfig(stages=stages, warmup_steps=2, eval_every=0, ckpt_every=0, lr=5e-3, val_windows=2)
    tr = Trainer(tmp_path / "run", mcfg, tcfg, tok, progress=False)
    before = tr.evaluate(64)
    summary = tr.fit()
    after = tr.evaluate(64)
    assert summary["steps"] == 20
    recs = read_metrics(tmp_path / "run")
    first, last = recs[0]["loss"], sum(r["loss"] for r in recs[-3:]) / 3
    assert last < first - 0.5, (first, last)
    assert after < before - 0.5, (before, after)
    assert all(math.isfinite(r["grad_norm"]) for r in recs)
    assert {"max_vio", "dead_experts", "router_entropy", "tokens_per_s", "lr"} <= set(recs[0])


def test_resume_reproduces_the_loss_sequence(tmp_path, mcfg, tcfg, tok):
    Trainer(tmp_path / "full", mcfg, tcfg, tok, progress=False).fit()
    Trainer(tmp_path / "cut", mcfg, tcfg, tok, progress=False, max_steps=4).fit()
    assert len(read_metrics(tmp_path / "cut")) == 4
    tr = Trainer(tmp_path / "cut", resume=True, progress=False)
    assert tr.step == 4
    tr.fit()
    full, cut = losses(tmp_path / "full"), losses(tmp_path / "cut")
    assert len(full) == tcfg.total_steps and full == cut  # bit-identical losses and val losses
    last = f"checkpoints/step-{tcfg.total_steps:08d}/trainer_state.pt"
    a = torch.load(tmp_path / "full" / last, weights_only=True)
    b = torch.load(tmp_path / "cut" / last, weights_only=True)
    assert a["curriculum"] == b["curriculum"] and a["tokens"] == b["tokens"]


def test_checkpoint_contents_and_keep_last(tmp_path, mcfg, tok):
    tcfg = small_train_config(ckpt_every=1, keep_last=2)
    tr = Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False)
    tr.fit()
    n = tcfg.total_steps
    ck = sorted(p.name for p in (tmp_path / "r/checkpoints").iterdir())
    assert ck == [f"step-{n - 1:08d}", f"step-{n:08d}"]
    st = torch.load(tmp_path / f"r/checkpoints/step-{n:08d}/trainer_state.pt", weights_only=True)
    assert {"step", "tokens", "optimizer", "rng", "curriculum"} <= set(st)
    assert st["curriculum"]["stage"] == 2  # curriculum finished: stage index past the last one
    from safetensors.torch import load_file

    w = load_file(str(tmp_path / f"r/checkpoints/step-{n:08d}/model.safetensors"))
    # balancer state travels with the weights
    assert torch.equal(w["blocks.1.ffn.bias"], tr.model.blocks[1].ffn.bias)
    assert (tmp_path / "r/final/tokenizer.json").is_file()


def test_plots_and_plot_command(tmp_path, mcfg, tcfg, tok):
    from longmoe.cli import main

    Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False, max_steps=3).fit()
    files = render(tmp_path / "r")
    assert {f.name for f in files} == {"loss.png", "balance.png"}
    for f in files:
        f.unlink()
    assert main(["plot", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r/loss.png").stat().st_size > 10_000
    assert main(["plot", str(tmp_path / "nope")]) == 2


def test_vocab_too_small_for_tokenizer(tmp_path, mcfg, tcfg, tok):
    with pytest.raises(ConfigError, match=r"vocab_size=300 is too small.*512"):
        Trainer(tmp_path / "r", mcfg.replace(vocab_size=300), tcfg, tok, progress=False)


def test_missing_and_empty_data(tmp_path, mcfg, tok):
    tcfg = small_train_config(data=str(tmp_path / "missing"))
    with pytest.raises(DataError, match="missing"):
        Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False).fit()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/a.txt").write_text("")
    tcfg = small_train_config(data=str(tmp_path / "empty"))
    with pytest.raises(DataError, match="empty|no documents"):
        Trainer(tmp_path / "r2", mcfg, tcfg, tok, progress=False).fit()


def test_train_cli_errors(tmp_path, capsys):
    from longmoe.cli import main

    rc = main(["train", "--run-dir", str(tmp_path / "r"), "--data", str(tmp_path / "nope"), "--no-progress"])
    assert rc == 2
    assert "nope" in capsys.readouterr().err
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"lr": -1}))
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--train-config", str(bad)]) == 2
    assert "lr" in capsys.readouterr().err


def test_bf16_autocast_and_grad_accum_train(tmp_path, mcfg, tok):
    tcfg = small_train_config(bf16=True, grad_accum=2, ckpt_every=0)
    tr = Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False)
    tr.fit()
    recs = read_metrics(tmp_path / "r")
    assert len(recs) == tcfg.total_steps == -(-10 // 2)
    assert all(math.isfinite(r["loss"]) and r["loss"] < 7 for r in recs)
    assert recs[0]["tokens"] == 2 * 4 * 64  # two batches of 4 windows of 64 per optimizer step


def _poison(tr, steps):
    """Make the gradient of one parameter NaN during the given (0-based) optimizer steps."""
    p = next(tr.model.parameters())
    p.register_hook(lambda g: torch.full_like(g, float("nan")) if tr.step in steps else g)


def test_non_finite_gradient_step_is_skipped_and_weights_survive(tmp_path, mcfg, tok):
    stages = [CurriculumStage("a", window=64, tokens=64 * 4 * 6, batch_size=4)]
    tcfg = TrainConfig(stages=stages, warmup_steps=1, eval_every=0, ckpt_every=0, lr=3e-3, val_windows=2)
    tr = Trainer(tmp_path / "run", mcfg, tcfg, tok, progress=False)
    _poison(tr, {2})
    recs = [tr.train_step() for _ in range(2)]
    before = {k: v.clone() for k, v in tr.model.state_dict().items() if v.is_floating_point()}
    exp_avg = {id(p): s["exp_avg"].clone() for p, s in tr.opt.state.items()}
    recs.append(tr.train_step())  # the poisoned step
    assert recs[-1]["skipped"] and not math.isfinite(recs[-1]["grad_norm"])
    params = dict(tr.model.named_parameters())
    for k, v in before.items():
        if k in params:  # parameters untouched (buffers such as the balancing bias may still move)
            assert torch.equal(params[k].detach(), v), k
    assert all(torch.equal(s["exp_avg"], exp_avg[id(p)]) for p, s in tr.opt.state.items())
    recs += [tr.train_step() for _ in range(3)]
    assert not any(r["skipped"] for r in recs[:2] + recs[3:])
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())
    assert tr.skipped_steps == 1 and tr.state()["skipped_steps"] == 1


def test_persistent_non_finite_gradients_stop_with_a_clear_error(tmp_path, mcfg, tok):
    from longmoe.train.pretrain import MAX_BAD_STEPS

    stages = [CurriculumStage("a", window=64, tokens=64 * 4 * (MAX_BAD_STEPS + 4), batch_size=4)]
    tcfg = TrainConfig(stages=stages, warmup_steps=1, eval_every=0, ckpt_every=0, lr=3e-3, val_windows=2)
    tr = Trainer(tmp_path / "run", mcfg, tcfg, tok, progress=False)
    _poison(tr, set(range(1, 10**6)))
    with pytest.raises(FloatingPointError, match=f"{MAX_BAD_STEPS} consecutive steps with non-finite"):
        tr.fit()
    assert tr.step == MAX_BAD_STEPS  # steps 1..8 were bad; the 8th raises before counting itself
    assert all(torch.isfinite(p).all() for p in tr.model.parameters())


def test_cli_synthetic_loss_sets_every_stage(tmp_path):
    """``longmoe train --synthetic-loss answer`` reaches every stage, default curriculum or a file's."""
    import argparse

    from longmoe.train.cli import add_arguments, build_train_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    tc = build_train_config(p.parse_args(["--synthetic-loss", "answer"]))
    assert len(tc.stages) > 1 and {s.synthetic_loss for s in tc.stages} == {"answer"}
    assert {s.synthetic_loss for s in build_train_config(p.parse_args([])).stages} == {"all"}
    f = tmp_path / "train_config.json"
    f.write_text(json.dumps({"stages": [{"name": "a", "window": 128, "tokens": 1024, "mix": {"file": 1.0}}]}))
    (st,) = build_train_config(p.parse_args(["--train-config", str(f), "--synthetic-loss", "answer"])).stages
    assert st.synthetic_loss == "answer"
    f.write_text(
        json.dumps({"stages": [{"name": "a", "window": 128, "tokens": 1024, "synthetic_loss": "x"}]})
    )
    with pytest.raises(ConfigError, match=r"stages\[0\].synthetic_loss"):
        build_train_config(p.parse_args(["--train-config", str(f)]))


def test_train_config_type_errors_name_file_field_and_type(tmp_path):
    """A wrong type in train_config.json is reported with the file, the field and the expected type."""
    f = tmp_path / "train_config.json"
    TrainConfig(stages=[CurriculumStage("a", window=64, tokens=256)]).save(f)
    d = json.loads(f.read_text())
    f.write_text(json.dumps({**d, "lr": "fast"}))
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(str(f))}: config field 'lr' = 'fast' .*expected a float"
    ):
        TrainConfig.load(f)
    d["stages"][0]["window"] = "64"
    f.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=r"'stages\[0\].window' = '64' is invalid: expected an integer"):
        TrainConfig.load(f)
    d["stages"][0] = {"name": "a", "window": 64, "tokens": 256, "windows": 2}
    f.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=r"unknown config field\(s\) \['stages\[0\].windows'\]"):
        TrainConfig.load(f)


CRASH_TAILS = ['{"step": 5, "loss": 3.1', "{", '{"step": 5, "lo\n', "\x00\x00\x00", "[1,", "5"]


@pytest.mark.parametrize("tail", CRASH_TAILS)
def test_truncated_metrics_line_is_dropped_with_a_warning(tmp_path, tail, caplog):
    lines = [json.dumps({"step": i, "loss": 1.0}) for i in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + tail)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert "truncated last line" in caplog.text


def test_truncated_metrics_line_after_a_crash_resumes(tmp_path, mcfg, tcfg, tok):
    """A process killed mid-write leaves a partial last line in metrics.jsonl: a resume drops it and
    goes on (that a resume reproduces the uninterrupted losses is tested above)."""
    Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False, max_steps=1).fit()
    with open(tmp_path / "r/metrics.jsonl", "a") as f:
        f.write(CRASH_TAILS[0])
    Trainer(tmp_path / "r", resume=True, progress=False, max_steps=2).fit()
    lines = (tmp_path / "r/metrics.jsonl").read_text().splitlines()
    assert [json.loads(ln)["step"] for ln in lines] == [1, 2]


def test_resume_refuses_a_checkpoint_from_another_config(tmp_path, mcfg, tcfg, tok):
    Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False, max_steps=1).fit()
    other = mcfg.replace(d_model=96, ffn=dataclasses.replace(mcfg.ffn, top_k=3))
    other.save(tmp_path / "r/config.json")  # as if the run's checkpoints had been copied from another run
    with pytest.raises(CheckpointError, match=r"another config.* in d_model, ffn\.top_k$"):
        Trainer(tmp_path / "r", resume=True, progress=False)


def test_config_differences_names_nested_fields():
    a = {"d_model": 64, "ffn": {"top_k": 2, "n_experts": 8}, "x": 1}
    assert config_differences(a, a) == []
    b = {"d_model": 64, "ffn": {"top_k": 3, "n_experts": 8}, "y": 1}
    assert config_differences(a, b) == ["ffn.top_k", "x", "y"]


def test_a_model_too_large_for_memory_is_refused_before_allocation(mcfg):
    need = training_memory(mcfg)["total"]
    assert need == 4 * sum(param_counts(mcfg).values()) * 4  # fp32 weights, grads, two AdamW moments
    check_memory(mcfg, available=need)
    with pytest.raises(ConfigError, match=r"needs at least .* GiB to train .* only 0\.0 GiB"):
        check_memory(mcfg, available=need - 1)
    with pytest.raises(ConfigError, match="GiB"):  # the flagship on any machine this runs on
        check_memory(preset("flagship"))
