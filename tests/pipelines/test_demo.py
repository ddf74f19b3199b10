"""The demo pipeline: config checks, the report from a typed result, and the whole run at toy scale."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from longmoe.cli import main
from longmoe.pipelines.demo.config import DemoConfig
from longmoe.pipelines.demo.recall import RECALL_DIR, recall_config, run_recall
from longmoe.pipelines.demo.report import render_report, report_table
from longmoe.pipelines.demo.result import DemoResult, LengthEval, RecallResult, Sample, StageResult


def _result() -> DemoResult:
    return DemoResult(
        params=1_860_000,
        steps=12,
        tokens=49_152,
        train_seconds=7.4,
        synthetic_documents=True,
        stages=[StageResult("s1-256", 256, 40_000, 0.0, 5.5), StageResult("s2-1k", 1024, 9_152, 0.25, None)],
        eval=[LengthEval(256, 5.0, 6.25, False), LengthEval(2048, 5.5, 6.25, True)],
        sample=Sample("import os\n\n\ndef ", "main():\n    pass"),
        plots=["loss.png", "balance.png"],
    )


def test_report_renders_the_typed_result():
    r = _result()
    md = render_report(r)
    lines = md.splitlines()
    assert lines[0] == "# longmoe demo report"
    assert lines[2].startswith("Tiny hybrid MoE model (`--preset tiny`: 1,860,000 parameters, 3:1 KDA:MLA")
    assert "12 optimizer steps, 49,152 training tokens, 7 s of training" in lines[2]
    assert lines[2].endswith("corpus plus synthetic long-context task documents.")
    assert (
        "| s1-256 | 256 | 40,000 | 0% | 5.500 |" in lines and "| s2-1k | 1,024 | 9,152 | 25% | – |" in lines
    )
    assert (
        "| 256 | 5.000 | 6.250 | 0.80 |" in lines
        and "| 2,048 (beyond training) | 5.500 | 6.250 | 0.88 |" in lines
    )
    assert report_table(r) in md and "unigram baseline" in md
    assert "```python\nimport os\n\n\ndef main():\n    pass\n```" in md
    assert md.endswith("## Plots\n\n![loss.png](loss.png)\n![balance.png](balance.png)\n")
    plain = render_report(DemoResult.from_dict(dict(r.to_dict(), synthetic_documents=False)))
    assert "corpus." in plain and "synthetic" not in plain.splitlines()[2]


def test_report_json_round_trips_with_its_keys():
    r = _result()
    d = json.loads(json.dumps(r.to_dict()))
    assert list(d) == [
        "params",
        "steps",
        "tokens",
        "train_seconds",
        "synthetic_documents",
        "stages",
        "eval",
        "sample",
        "plots",
        "recall",
    ]
    assert list(d["stages"][0]) == ["name", "window", "tokens", "replay_fraction", "val_loss_at_end"]
    assert list(d["eval"][0]) == ["length", "val_loss", "unigram_loss", "beyond_training"]
    assert d["sample"] == {"prompt": "import os\n\n\ndef ", "completion": "main():\n    pass"}
    assert DemoResult.from_dict(d) == r


def test_demo_config_is_validated(tmp_path, capsys):
    with pytest.raises(ValueError, match="scale"):
        DemoConfig(scale=0)
    with pytest.raises(ValueError, match="val_windows"):
        DemoConfig(val_windows=0)
    assert main(["demo", "--run-dir", str(tmp_path / "d"), "--scale", "-1"]) == 2
    assert "scale=-1.0" in capsys.readouterr().err and not (tmp_path / "d").exists()


def _recall() -> RecallResult:
    return RecallResult(
        pattern="LM", d_model=64, params=100_000, n_pairs=8, train_len=64, steps=250, train_seconds=60.0,
        solved=True, chance=0.03125, answers=512, accuracy={"64": 0.998, "256": 0.99, "1024": 0.5},
    )  # fmt: skip


def test_report_says_what_the_models_can_and_cannot_do():
    r = DemoResult.from_dict(dict(_result().to_dict(), recall=dataclasses.asdict(_recall())))
    assert r.recall == _recall() and DemoResult.from_dict(r.to_dict()) == r
    md = render_report(r)
    assert "## What the models can and cannot do" in md and "**cannot** write working code" in md
    assert (
        "partly can recall the value of every key: 99.8% at 64 tokens, 99.0% at 256 tokens, 50.0% at " in md
    )
    assert "| 64 (training length) | 0.998 ± 0.002 | 0.031 |" in md
    assert "| 1,024 (16x training) | 0.500 ± 0.022 | 0.031 |" in md
    assert md.index("## Associative recall (MQAR)") < md.index("## Sample") < md.index("## Plots")
    solved = dataclasses.replace(_recall(), accuracy={"64": 1.0, "256": 0.95})
    assert "**can** recall" in render_report(dataclasses.replace(r, recall=solved))
    assert "Associative recall" not in render_report(_result()), "no recall part: no recall section"


def test_recall_part_runs_small_and_resumes(tmp_path):
    cfg = DemoConfig(run_dir=tmp_path, scale=0.02, recall_pairs=2)
    rc, cell = recall_config(cfg)
    assert (rc.steps, rc.eval_n, rc.eval_lengths, cell.pattern) == (10, 8, [64, 256, 1024], "LM")
    r = run_recall(cfg)
    assert r.steps <= 10 and set(r.accuracy) == {"64", "256", "1024"} and r.answers == 16
    assert all(0.0 <= a <= 1.0 for a in r.accuracy.values()) and r.chance == 1 / r.n_pairs
    stored = tmp_path / RECALL_DIR / "runs" / f"{cell.key}.json"
    mtime = stored.stat().st_mtime
    assert run_recall(cfg) == r and stored.stat().st_mtime == mtime, "a finished recall run is read back"
    with pytest.raises(ValueError, match="recall_pairs"):
        DemoConfig(recall_pairs=0)


@pytest.mark.slow(wall="not measured; the whole demo pipeline")
def test_demo_end_to_end(tmp_path):
    assert main(["demo", "--run-dir", str(tmp_path / "demo"), "--scale", "0.02", "--no-progress"]) == 0
    rep = json.loads((tmp_path / "demo/report.json").read_text())
    assert [e["length"] for e in rep["eval"]] == [256, 1024, 4096, 8192]
    assert all(math.isfinite(e["val_loss"]) and e["unigram_loss"] > 0 for e in rep["eval"])
    md = (tmp_path / "demo/report.md").read_text()
    assert "unigram baseline" in md and "![loss.png](loss.png)" in md
    assert (tmp_path / "demo/loss.png").is_file() and (tmp_path / "demo/final/model.safetensors").is_file()
    assert rep["synthetic_documents"] and isinstance(rep["sample"]["completion"], str)
    prov = rep.pop("provenance")  # written beside the result, so `make demo` can publish it as is
    assert {"commit", "date", "command", "wall_s", "peers"} <= set(prov) and prov["command"].startswith(
        "longmoe"
    )
    assert DemoResult.from_dict(rep).to_dict() == rep
    assert set(rep["recall"]["accuracy"]) == {"64", "256", "1024"} and "## Associative recall (MQAR)" in md
    # a resumed finished run trains no further and reports the same curriculum (the per-stage losses
    # are those of stages that ended in this session: none)
    assert main(["demo", "--run-dir", str(tmp_path / "demo"), "--resume", "--no-progress"]) == 0
    again = json.loads((tmp_path / "demo/report.json").read_text())
    assert (again["steps"], again["tokens"]) == (rep["steps"], rep["tokens"])
    strip = lambda stages: [{k: v for k, v in s.items() if k != "val_loss_at_end"} for s in stages]
    assert strip(again["stages"]) == strip(rep["stages"])
    assert [e["length"] for e in again["eval"]] == [256, 1024, 4096, 8192]
