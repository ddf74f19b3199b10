"""The MQAR sweep recipe: config checks, models per pattern, the NoPE control, resuming (a stored
result, and an interrupted cell from its checkpoints), best-lr selection, the expectation verdicts and
the report, and a whole quick run."""

from __future__ import annotations

import json

import pytest
import torch

from longmoe.errors import UserError
from longmoe.model import LongMoE
from longmoe.pipelines.mqar import run as mqar_run
from longmoe.pipelines.mqar.__main__ import main
from longmoe.pipelines.mqar.checks import expected_checks
from longmoe.pipelines.mqar.config import Cell, SweepConfig
from longmoe.pipelines.mqar.model import ShortConv, build, model_config
from longmoe.pipelines.mqar.report import distances, render_report
from longmoe.pipelines.mqar.result import PROTOCOL, RunResult, SweepResult
from longmoe.tasks.base import TaskError
from longmoe.tasks.mqar import max_distance


def test_config_is_validated():
    with pytest.raises(ValueError, match="patterns"):
        SweepConfig(patterns=["LX"])
    with pytest.raises(ValueError, match="positions"):
        SweepConfig(positions=["rope"])
    with pytest.raises(TaskError, match="too short"):
        SweepConfig(train_len=64, vocab_size=256, pairs=[32])
    with pytest.raises(TaskError, match="too many for vocab_size=64"):
        SweepConfig(train_len=256, vocab_size=64, pairs=[32])
    with pytest.raises(ValueError, match="seeds"):
        SweepConfig(seeds=[5000])  # its training rows would reach the validation seeds
    rc = SweepConfig(patterns=["L", "M"], d_models=[64], pairs=[4, 8], lrs=[1e-3, 1e-2], positions=["none"])
    cells = rc.cells()
    assert len(cells) == 8 and cells[0].n_pairs == 4 and cells[-1].n_pairs == 8
    assert [c.pattern for c in cells] == ["L"] * 4 + ["M"] * 4, "pattern by pattern"
    ctl = SweepConfig(patterns=["L", "M"], d_models=[64], pairs=[4], lrs=[1e-3], positions=["none", "conv"])
    assert [c.key for c in ctl.cells()] == [
        "L-d64-p4-none-lr0.001-s0",
        "M-d64-p4-none-lr0.001-s0",
        "M-d64-p4-conv-lr0.001-s0",
    ], "controls only for control_patterns (M)"
    assert rc.eval_lengths == [64, 256, 1024]
    assert SweepConfig.from_dict(rc.to_dict()) == rc


@pytest.mark.parametrize(("pattern", "types"), [("L", "LL"), ("M", "MM"), ("LM", "LM"), ("LLLM", "LLLM")])
def test_models_per_pattern(pattern, types):
    cfg = model_config(pattern, 32, 64, 256, attn_res=False)
    assert "".join(cfg.layer_types) == types and cfg.ffn.kind == "dense"


def test_short_conv_control_is_causal_and_leaves_the_model_alone():
    torch.manual_seed(0)
    cfg = model_config("M", 32, 64, 64, attn_res=False)
    ids = torch.randint(0, 64, (2, 12))
    plain = LongMoE(cfg)
    model, trained = build(cfg, "conv")
    model.load_state_dict(plain.state_dict())
    assert not torch.allclose(model(ids).logits, plain(ids).logits), "the hook changes what layer 1 reads"
    assert len(list(trained.parameters())) == len(list(model.parameters())) + 1
    fresh = LongMoE(cfg)
    assert not fresh.embed._forward_hooks, "a plain model has no hook: the default model is unchanged"
    conv = ShortConv(8)
    assert conv.weight.abs().max() <= 0.5 and conv.weight.std() > 0.1, "KDA's conv init, not zeros"
    x = torch.randn(1, 10, 8)
    y = conv(x)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    assert torch.equal(conv(x2)[:, :6], y[:, :6]), "a position sees no later token"
    assert not torch.equal(conv(x2)[:, 6:9], y[:, 6:9])
    with pytest.raises(ValueError, match="position"):
        build(cfg, "rope")


def _run(
    pattern: str,
    pairs: int,
    acc: float,
    lr: float = 1e-3,
    position: str = "none",
    long_acc=None,
    val=None,
    seed: int = 0,
) -> RunResult:
    la, v = acc if long_acc is None else long_acc, acc if val is None else val
    return RunResult(
        Cell(pattern, 64, pairs, position, lr, seed), 1000, 0, 100, v >= 0.99, 1.0, [(100, 0.1, v)],
        {"128": acc, "512": la, "2048": la}, {"128": v}, PROTOCOL,
    )  # fmt: skip


def test_best_lr_is_kept_and_checks_read_the_numbers():
    rc = SweepConfig(patterns=["L", "M", "LM"], pairs=[4, 32], train_len=128, vocab_size=256)
    runs = [
        _run("M", 4, 0.2), _run("M", 4, 1.0, lr=3e-3), _run("M", 32, 0.5),
        _run("M", 4, 1.0, position="conv"), _run("M", 32, 1.0, position="conv"),
        _run("L", 4, 1.0), _run("L", 32, 0.3), _run("LM", 4, 1.0), _run("LM", 32, 0.995, long_acc=0.5),
    ]  # fmt: skip
    best = mqar_run.best_runs(runs, 128)
    m4 = ("M", 64, 4, "none", 0.0)
    assert len(best) == 8 and [r.cell.lr for r in best if r.cell.setting == m4] == [3e-3]
    verdicts = {c.claim.split(" (")[0].split(" reaches")[0]: c.verdict for c in expected_checks(rc, best)}
    assert verdicts["pure MLA"] == "not confirmed"
    assert verdicts["pure KDA"] == "confirmed"
    assert verdicts["hybrid LM"] == "confirmed"
    assert verdicts["the NoPE control: a short causal conv before MLA"].startswith(
        "confirmed: NoPE MLA needs"
    )
    assert verdicts["LM keeps its recall at 4x the training length"] == "not confirmed"
    assert verdicts["M+conv keeps its recall at 4x the training length"] == "confirmed"
    md = render_report(rc, SweepResult(runs, best, expected_checks(rc, best), runs[0]))
    assert "| M+conv | 64 | 32 | 0 | 0.001 | 100 | 0 | 0.031 | 1.000 ± 0.000 [0.500] |" in md, "1/P, M"
    assert (
        "| LM | 64 | 32 | 0 | 0.001 | 100 | 0 | 0.031 | 0.995 ± 0.001 [0.500] | 0.500 ± 0.008 [0.500] |" in md
    )
    assert "predate" not in md


def test_lr_is_chosen_on_validation_rows_over_seeds_never_on_test_rows():
    runs = [  # lr 1e-3: better on test, worse on validation; lr 1e-2: the reverse
        _run("L", 4, 1.0, lr=1e-3, val=0.8, seed=0), _run("L", 4, 1.0, lr=1e-3, val=0.9, seed=1),
        _run("L", 4, 0.5, lr=1e-2, val=0.95, seed=0), _run("L", 4, 0.6, lr=1e-2, val=0.85, seed=1),
    ]  # fmt: skip
    best = mqar_run.best_runs(runs, 128)
    assert sorted((r.cell.lr, r.cell.seed) for r in best) == [(1e-2, 0), (1e-2, 1)], "mean val 0.9 > 0.85"


def test_unsolved_cells_count_in_the_extrapolation_verdict():
    rc = SweepConfig(patterns=["L"], pairs=[4, 32], train_len=128, vocab_size=256, positions=["none"])
    best = [_run("L", 4, 1.0), _run("L", 32, 0.6, long_acc=0.1)]  # unsolved, and falls with length
    (c,) = [c for c in expected_checks(rc, best) if c.claim.startswith("L keeps its recall at 4x")]
    assert c.verdict == "not confirmed" and "1 of 2 cells below 0.99" in c.evidence


def test_extrapolation_is_not_measurable_when_no_cell_learns_the_task():
    """A pattern at chance in every cell has no recall to keep: its flat accuracy is not a
    'confirmed' extrapolation."""
    rc = SweepConfig(patterns=["M", "L"], pairs=[4, 32], train_len=128, vocab_size=256, positions=["none"])
    best = [_run("M", 4, 0.25), _run("M", 32, 0.03), _run("L", 4, 0.98), _run("L", 32, 0.95)]  # M at chance
    (c,) = [c for c in expected_checks(rc, best) if c.claim.startswith("M keeps its recall at 4x")]
    assert c.verdict.startswith("not measurable") and "2 of 2 cells below 0.99" in c.evidence
    (c,) = [c for c in expected_checks(rc, best) if c.claim.startswith("L keeps its recall at 4x")]
    assert c.verdict == "confirmed", "just under the target is still recall to keep"


def test_legacy_runs_are_flagged_in_the_report_and_retrained(tmp_path, monkeypatch):
    rc = SweepConfig(patterns=["L"], pairs=[4], train_len=128, vocab_size=256, positions=["none"])
    old = RunResult.from_dict({k: v for k, v in _run("L", 4, 1.0).to_dict().items()
                               if k not in ("val_accuracy", "protocol")})  # fmt: skip
    assert old.legacy and old.val_acc(128) == old.acc(128) == 1.0
    md = render_report(rc, SweepResult([old], [old], expected_checks(rc, [old]), None, distances(rc)))
    assert "1 of 1 runs predate the test-row protocol" in md
    f = tmp_path / "runs" / f"{old.cell.key}.json"
    f.parent.mkdir()
    f.write_text(json.dumps(old.to_dict()))
    new = _run("L", 4, 0.9)
    monkeypatch.setattr(mqar_run, "train_cell", lambda c, r, log=False, run_dir=None: new)
    assert mqar_run.run_cell(old.cell, rc, tmp_path) == new, "a legacy stored run is retrained"


def test_distance_table_counts_queries_beyond_the_training_distances():
    rc = SweepConfig(patterns=["L"], pairs=[4], train_len=64, vocab_size=64, positions=["none"], eval_n=64)
    rows = distances(rc)
    assert [r["length"] for r in rows] == [64, 256, 1024]
    assert rows[0]["beyond_train"] == 0.0 and rows[0]["max"] <= rows[0]["train_max"] == max_distance(64, 4)
    assert 0 < rows[1]["beyond_train"] < rows[2]["beyond_train"] < 1, "longer rows put more queries further"


def test_run_cell_resumes_from_its_json(tmp_path, monkeypatch):
    rc = SweepConfig()
    stored = _run("LM", 4, 1.0)
    calls = []
    monkeypatch.setattr(
        mqar_run, "train_cell", lambda c, r, log=False, run_dir=None: calls.append(c) or stored
    )
    assert mqar_run.run_cell(stored.cell, rc, tmp_path) == stored
    assert mqar_run.run_cell(stored.cell, rc, tmp_path) == stored and len(calls) == 1
    f = tmp_path / "runs" / f"{stored.cell.key}.json"
    assert RunResult.from_dict(json.loads(f.read_text())) == stored


class Interrupted(Exception):
    pass


def test_an_interrupted_cell_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
    """A cell killed after its step-4 checkpoint resumes there (conv control included) and ends with
    the losses, accuracies and weights of a run that never stopped; its checkpoints go with the result."""
    rc = SweepConfig(patterns=["M"], d_models=[16], pairs=[2], train_len=32, eval_multiples=[1, 2], steps=6,
                     batch_size=4, eval_every=3, eval_n=8, warmup_steps=2, target_accuracy=1.0,
                     checkpoint_every=2)  # fmt: skip
    cell = Cell("M", 16, 2, "conv", 3e-3, 0)
    built: list[torch.nn.Module] = []
    real_build, real_seed = mqar_run.build, mqar_run.train_seed

    def recorded_build(*a):
        built.append(real_build(*a)[1])  # the model and the control's conv: what trains
        return built[-1]["model"], built[-1]

    monkeypatch.setattr(mqar_run, "build", recorded_build)
    whole = mqar_run.train_cell(cell, rc)

    def dies_at_step_5(seed: int, step: int) -> int:
        if step == 5:
            raise Interrupted
        return real_seed(seed, step)

    monkeypatch.setattr(mqar_run, "train_seed", dies_at_step_5)
    with pytest.raises(Interrupted):
        mqar_run.run_cell(cell, rc, tmp_path)
    steps: list[int] = []
    monkeypatch.setattr(
        mqar_run, "train_seed", lambda seed, step: steps.append(step) or real_seed(seed, step)
    )
    resumed = mqar_run.run_cell(cell, rc, tmp_path)
    assert steps == [4, 5], "the resumed cell trains from its step-4 checkpoint on"
    assert resumed.curve == whole.curve and resumed.steps == whole.steps == 6
    assert resumed.accuracy == whole.accuracy and resumed.val_accuracy == whole.val_accuracy
    for k, v in built[-1].state_dict().items():
        assert torch.equal(v, built[0].state_dict()[k]), k
    assert not (tmp_path / "runs" / cell.key).exists() and (tmp_path / "runs" / f"{cell.key}.json").is_file()

    monkeypatch.setattr(mqar_run, "train_seed", dies_at_step_5)
    with pytest.raises(Interrupted):
        mqar_run.train_cell(cell, rc, run_dir=tmp_path / "cut")
    other = SweepConfig.from_dict({**rc.to_dict(), "steps": 8, "seeds": [0, 1]})
    refused = r"^cell M-d16-p2-conv-lr0.003-s0 differs from the run's .*cell.json in steps "
    with pytest.raises(UserError, match=refused):
        mqar_run.train_cell(cell, other, run_dir=tmp_path / "cut")  # the seeds list chooses cells: not in it


def test_quick_sweep_end_to_end_and_rerun_skips(tmp_path, capsys):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["LM-d32-p2-none-lr0.003-s0.json", "M-d32-p2-none-lr0.003-s0.json"]
    res = json.loads((tmp_path / "results.json").read_text())
    assert set(res["best"][0]["accuracy"]) == {"32", "128"} and res["sanity"]["steps"] == 30
    assert res["best"][0]["protocol"] == PROTOCOL and set(res["best"][0]["val_accuracy"]) == {"32"}
    assert [d["length"] for d in res["distances"]] == [32, 128]
    assert (tmp_path / "plots/acc_vs_pairs.png").is_file() and (
        tmp_path / "plots/acc_vs_length.png"
    ).is_file()
    mtime = (tmp_path / "runs" / runs[0]).stat().st_mtime
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "runs" / runs[0]).stat().st_mtime == mtime, "a finished run is not redone"
    (tmp_path / "report.md").unlink()
    assert main(["--quick", "--out", str(tmp_path), "--report-only", "--pairs", "2,4"]) == 0
    assert "| LM | 32 | 2 |" in (tmp_path / "report.md").read_text(), "report-only reads the stored runs"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs, "and trains nothing"
    assert main(["--quick", "--out", str(tmp_path), "--patterns", "LZ"]) == 2
    assert "patterns" in capsys.readouterr().err
