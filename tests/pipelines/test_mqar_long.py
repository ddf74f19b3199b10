"""The MQAR recipe's long-row stage (``--long``): settings are validated, a quick run trains, measures,
reports and publishes, a rerun loads the stored weights and measures only what is missing, and the
summary's verdicts (the issue's target, each remedy against its plain model) read the numbers."""

from __future__ import annotations

import json

import pytest

from longmoe.pipelines.mqar import long_run
from longmoe.pipelines.mqar.__main__ import main
from longmoe.pipelines.mqar.long_config import LONG_CONFIG_FILE, LongConfig, Variant
from longmoe.pipelines.mqar.long_report import checks, publish, render, summarise, tables

QUICK = ["--long", "--quick", "--allow-dirty", "--variants", "LM,M+conv+logn,LLLM"]


def test_shipped_settings_load_and_bad_ones_name_the_field():
    lc = LongConfig.load(LONG_CONFIG_FILE)
    assert [v.name for v in lc.variants] == ["LLLM", "LM", "L", "M+conv", "LLLM+logn", "M+conv+logn"]
    assert max(lc.lengths) == 65536 and lc.seeds == [0, 1, 2] and lc.far_variants == ["LLLM"]
    assert lc.rows_at(lc.variant("M+conv"), 65536) == 3 and lc.rows_at(lc.variant("LLLM"), 65536) == 6
    assert LongConfig.from_dict(lc.to_dict()) == lc
    for bad, match in (
        ({"rows": [1]}, "rows"),
        ({"placements": ["far"]}, "placements"),
        ({"far_variants": ["XL"]}, "far_variants"),
        ({"variants": [{"pattern": "LX"}]}, "pattern"),
        ({"variants": [{"pattern": "L"}, {"pattern": "L", "lr": 0.1}]}, "same name"),
        ({"variants": [{"pattern": "M", "logn_scale": -1.0}]}, "logn_scale"),
        ({"lengths": [0], "rows": [1]}, "lengths"),
    ):
        with pytest.raises(ValueError, match=match):
            LongConfig(**{**lc.to_dict(), **bad})


def test_quick_stage_trains_measures_reports_and_a_rerun_measures_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert main([*QUICK, "--out", str(out)]) == 0
    res = json.loads((out / "long_results.json").read_text())
    keys = sorted(p.name for p in (out / "long").iterdir())
    assert len(keys) == 6 and not any(k.endswith(".train") for k in keys), "weights + record per model"
    names = {(s["variant"], s["placement"], s["length"]) for s in res["summary"]}
    for v in ("LM", "M+conv+logn", "LLLM"):
        assert {(v, p, n) for p in ("near", "uniform") for n in (128, 256)} <= names
    assert ("LLLM", "uniform", 512) in names and ("LM", "uniform", 512) not in names, "far: LLLM, seed 0"
    m = next(r for r in res["models"] if r["cell"]["logn_scale"] == 0.24)
    assert m["recall"]["uniform"]["256"]["answers"] == 2 * 4 and m["recall"]["uniform"]["256"]["entropy"] > 0
    assert res["provenance"]["commit"] and res["chance"] == 0.25
    assert (out / "plots/recall_by_length.png").is_file() and "| LM |" in (out / "long_report.md").read_text()
    assert render(res) in (out / "long_report.md").read_text(), "the docs table is the report's"

    def no_training(*_a, **_k):
        raise AssertionError("a stored model was retrained")

    monkeypatch.setattr(long_run, "fit_cell", no_training)
    monkeypatch.setattr(long_run, "measure", no_training)
    before = {k: (out / "long" / k).read_bytes() for k in keys}
    assert main([*QUICK, "--out", str(out)]) == 0
    assert {k: (out / "long" / k).read_bytes() for k in keys} == before
    assert main([*QUICK, "--out", str(out), "--report-only", "--variants", "LM", "--note", "busy"]) == 0
    assert "| LLLM |" not in (out / "long_report.md").read_text(), "the report of the variants asked for"
    prov = json.loads((out / "long_results.json").read_text())["provenance"]
    assert prov["date"] == res["provenance"]["date"] and prov["report_only"]["note"] == "busy", "run's record"
    root = tmp_path / "repo"
    assert [p.relative_to(root).as_posix() for p in publish(out, root)] == [
        "docs/results/mqar_long_results.json",
        "docs/figures/mqar_recall_by_length.png",
    ]
    assert main([*QUICK, "--out", str(out), "--placements", "middle"]) == 2
    assert "placements" in capsys.readouterr().err


def _record(
    pattern: str, seed: int, accs: dict[int, float], logn: float = 0.0, position: str = "none"
) -> dict:
    cell = {
        "pattern": pattern,
        "d_model": 64,
        "n_pairs": 8,
        "position": position,
        "lr": 0.01,
        "seed": seed,
        "logn_scale": logn,
    }
    by = {
        str(n): {"correct": round(a * 64), "answers": 64, "acc": a, "rows": 8, "entropy": 3.0, "cpu_s": 1.0}
        for n, a in accs.items()
    }
    return {
        "cell": cell,
        "train": {"accuracy": {"64": 0.99}},
        "train_cpu_s": 10.0,
        "recall": {"uniform": by, "near": by},
    }


def test_verdicts_read_the_numbers():
    """The target is met on the mean over seeds; a remedy is judged on differences paired by seed, beyond
    two standard errors over seeds."""
    lc = LongConfig(
        variants=[Variant("LLLM"), Variant("LM"), Variant("LLLM", logn_scale=0.24)],
        lengths=[4096, 65536],
        rows=[8, 8],
        far_variants=[],
        far_lengths=[],
        far_rows=[],
    )
    recs = [
        *[_record("LLLM", s, {4096: 0.95, 65536: a}) for s, a in enumerate((0.90, 0.92, 0.94))],
        *[_record("LM", s, {4096: 0.9, 65536: a}) for s, a in enumerate((0.5, 0.6, 0.7))],
        *[_record("LLLM", s, {4096: 0.95, 65536: a}, logn=0.24) for s, a in enumerate((0.97, 0.98, 0.99))],
    ]
    training = {"train_len": 64, "eval_n": 128}
    summary = summarise(lc, training, recs)
    top = next(
        s for s in summary if (s["variant"], s["placement"], s["length"]) == ("LLLM", "uniform", 65536)
    )
    assert top["mean"] == 0.92 and top["se"] == pytest.approx(0.0115, abs=1e-4) and top["answers"] == 192
    verdicts = {
        c["claim"].split(" recall")[0].split(" (s")[0] + c["claim"][-30:]: c["verdict"]
        for c in checks(lc, summary)
    }
    got = sorted(verdicts.values())
    assert got == ["helps", "helps", "met", "met", "missed"], verdicts
    recs += [_record("M", s, {4096: 0.9, 65536: a}, position="conv") for s, a in enumerate((0.5, 0.6, 0.7))]
    lc.variants.append(Variant("M", "conv"))
    nope = [c for c in checks(lc, summarise(lc, training, recs)) if c["claim"].startswith("NoPE attention")]
    assert [c["verdict"] for c in nope] == ["not confirmed"] * 2 and "0.990 at 64 tokens" in nope[0][
        "evidence"
    ]
    from longmoe.pipelines.mqar.long_report import _against

    assert _against(0.93, 0.05, 0.9).startswith("unresolved") and _against(0.84, 0.05, 0.9) == "missed"
    md = tables(lc, 64, summary, checks(lc, summary))
    assert "| LLLM | 0.990 ± 0.000 | 0.950 ± 0.000 | 0.920 ± 0.011 |" in md
    assert "| chance 1/P | 0.125 | 0.125 | 0.125 |" in md
