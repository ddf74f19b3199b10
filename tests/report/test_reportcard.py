"""The report card's collector and renderer on a temporary results folder (no torch, no repository)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from longmoe.report.card import NOT_RECORDED, ReportError, collect, headline_table, provenance, render, run


def _write(d: Path, name: str, payload: object) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.json"
    p.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    return p


QUANT = {
    "variants": {
        v: {"val_loss": {"4096": 6.3}, "weight_bytes": {"total": b}}
        for v, b in (("fp32", 4 << 20), ("int4", 1 << 20))
    }
}


def test_a_file_without_provenance_says_not_recorded_for_every_field(tmp_path):
    _write(tmp_path, "quant", QUANT)
    [r] = collect([tmp_path])
    assert set(provenance(r.data).values()) == {NOT_RECORDED}
    assert render([r], tmp_path).split("Provenance: ")[1].count(NOT_RECORDED) == 7


def test_recorded_provenance_is_printed_and_old_machine_fields_are_read():
    rec = {"commit": "abc123", "date": "2026-12-06 10:00 UTC", "machine": "h, cpu", "threads": 2}
    p = provenance({"provenance": {**rec, "command": "python -m bench.quant", "wall_s": 61.4}})
    assert p == {
        **rec,
        "threads": "2",
        "command": "python -m bench.quant",
        "wall_s": "61 s",
        "peers": NOT_RECORDED,
    }
    with_peers = provenance(
        {"provenance": {**rec, "peers": {"torch": "2.13.0", "llama-cpp-python": "0.3.36"}}}
    )
    assert with_peers["peers"] == "torch 2.13.0, llama-cpp-python 0.3.36"
    old = provenance({"machine": {"cpu": "x86_64", "torch": "2.13.0", "threads": 1}})
    assert (
        old["machine"] == "x86_64, torch 2.13.0" and old["threads"] == "1" and old["commit"] == NOT_RECORDED
    )


def test_malformed_json_is_a_one_line_error_naming_the_file(tmp_path):
    bad = _write(tmp_path, "broken", '{"rows": [1, 2,')
    with pytest.raises(ReportError) as e:
        collect([tmp_path])
    msg = str(e.value)
    assert str(bad) in msg and "not valid JSON" in msg and "\n" not in msg


def test_a_json_that_is_not_an_object_is_an_error_naming_the_file(tmp_path):
    bad = _write(tmp_path, "list", "[1, 2]")
    with pytest.raises(ReportError, match=f"{bad}: expected a JSON object"):
        collect([tmp_path])


def test_a_missing_results_folder_is_an_error(tmp_path):
    with pytest.raises(ReportError, match="no such results folder"):
        collect([tmp_path / "nope"])


def test_a_known_file_with_a_changed_layout_names_the_file(tmp_path):
    p = _write(tmp_path, "quant", {"variants": {}})
    with pytest.raises(ReportError, match=f"{p}: headline numbers not found"):
        render(collect([tmp_path]), tmp_path)


COMPILE = {
    "provenance": {"commit": "abc123", "command": "python -m bench.serve --compile-model kimi300m"},
    "config": {"d_model": 1024, "n_layers": 16},
    "compiled": {"context": 1024, "eager_ms": 60.0, "compiled_ms": 30.0,
                 "rounds": [{"eager_ms": 60.0, "compiled_ms": 30.0}, {"eager_ms": 57.0, "compiled_ms": 30.0},
                            {"eager_ms": 66.0, "compiled_ms": 30.0}]},
}  # fmt: skip


def test_headlines_carry_model_value_baseline_noise_and_source_with_its_commit(tmp_path):
    _write(tmp_path, "quant", QUANT)
    _write(tmp_path, "serve_compile_kimi300m", COMPILE)
    _write(tmp_path / "docs", "unknown_results", {"x": 1})
    _write(tmp_path, "quant_quick", QUANT)
    results = collect([tmp_path, tmp_path / "docs"])
    assert [r.name for r in results] == ["quant", "quant_quick", "serve_compile_kimi300m", "unknown"]
    table = headline_table(results, tmp_path)
    row = next(line for line in table.splitlines() if "compiled engine decode" in line)
    assert "~0.3B Kimi-Linear" in row and "| 30 |" in row and "2.00×" in row and "[1.90, 2.20]" in row
    assert "`serve_compile_kimi300m.json` (abc123)" in row
    assert "1.00 MiB" not in table  # quant has no interval: report card only
    card = render(results, tmp_path)
    assert "1.00 MiB, loss 6.300" in card and "fp32 4.00 MiB" in card
    assert "## unknown" in card and "No headline numbers defined" in card
    assert "Smoke runs" in card and "## quant_quick" not in card


@pytest.mark.parametrize(
    ("model", "noise_kind", "broken"),
    [
        ("", "range", "names no model"),
        ("~0.3B", "", "no range or interval"),
        ("~0.3B", "sometimes", "no range"),
    ],
)
def test_a_readme_headline_without_model_or_range_breaks_the_rules(
    tmp_path, monkeypatch, model, noise_kind, broken
):
    from longmoe.report import headlines, rules

    h = rules.Headline("x", "1", "peer 2", "noise", readme=True, model=model, noise_kind=noise_kind)
    assert any(broken in v for v in rules.violations(h))
    assert rules.violations(rules.Headline("x", "1", "peer 2", "one run")) == []  # report card only
    monkeypatch.setitem(headlines.HEADLINES, "quant", lambda d: [h])
    p = _write(tmp_path, "quant", QUANT)
    with pytest.raises(ReportError, match=f"{p}: README headline 'x' .*{broken}"):
        headline_table(collect([tmp_path]), tmp_path)


def test_speculative_headline_is_the_median_over_every_cell_not_the_best():
    from longmoe.report.headlines import _spec

    runs = [{"case": "none", "speedup_median": m, "draft": "d", "k": 1, "batch": 1, "acceptance": 0.9,
             "speedup_rounds": [m]} for m in (0.5, 0.8, 1.0, 1.2, 3.0)]  # fmt: skip
    [h] = _spec({"runs": runs, "rounds": 3})
    assert h.value == "1.00×" and "[0.50, 3.00]" in h.noise and "2 of 5 cells faster" in h.baseline


def test_rollout_headline_keeps_the_episode_counts_where_sessions_lose():
    from longmoe.report.serve_headlines import rollout as _rollout

    rows = [{"mode": m, "episodes": n, "speedup_vs_reprefill": s, "tok_s": 1.0}
            for n, s in ((1, 1.7), (8, 1.2), (32, 0.89)) for m in ("session", "re-prefill")]  # fmt: skip
    [h] = _rollout({"rows": rows})
    assert "32: 0.89×" in h.value and "slower at 32 episodes" in h.baseline


def test_mqar_long_headline_is_each_hybrid_at_the_longest_length_with_queries_anywhere():
    from longmoe.report.headlines import _mqar_long

    def row(v: str, p: str, n: int, mean: float, se: float | None) -> dict:
        return {"variant": v, "placement": p, "length": n, "seeds": [0, 1, 2], "mean": mean, "se": se,
                "pooled_se": 0.01}  # fmt: skip

    summary = [
        row("LLLM", "uniform", 65536, 0.5, 0.1), row("LLLM", "near", 65536, 0.99, 0.0),
        row("LM", "uniform", 4096, 0.9, 0.01), row("L", "uniform", 65536, 0.2, 0.05),
        row("LM", "uniform", 65536, 0.3, None),
    ]  # fmt: skip
    d = {"settings": {"lengths": [4096, 65536], "target": 0.9, "d_model": 64}, "training": {"train_len": 64},
         "chance": 0.125, "summary": summary}  # fmt: skip
    hs = _mqar_long(d)
    assert [h.value for h in hs] == ["0.500 ± 0.100", "0.300 ± 0.010"], "uniform, longest, hybrids only"
    assert (
        "65,536 tokens" in hs[0].label and "target 0.9" in hs[0].baseline and "chance 0.125" in hs[0].baseline
    )


def test_kda_headline_reads_against_the_peers_faster_setting():
    from longmoe.report.headlines import _kda

    row = {"T": 4096, "dtype": "float32", "fwd_s": {"longmoe": 0.01, "transformers chunk64": 0.2,
           "transformers chunk16": 0.05}, "speedup_fwd": {"transformers chunk64": 20.0}}  # fmt: skip
    h = _kda({"results": [row]})[0]
    assert "transformers chunk16" in h.baseline and "5.00× faster" in h.baseline


def test_check_exits_1_when_the_report_is_stale_and_0_once_written(tmp_path, capsys):
    _write(tmp_path / "r", "quant", QUANT)
    out = tmp_path / "report.md"
    args = argparse.Namespace(results=[tmp_path / "r"], out=out, check=True)
    assert run(args) == 1
    assert run(argparse.Namespace(results=[tmp_path / "r"], out=out, check=False)) == 0
    assert run(args) == 0


def test_the_report_card_imports_no_torch():
    code = "import sys, longmoe.report.card; sys.exit('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2]).returncode == 0
    )


@pytest.mark.parametrize(
    ("ours", "peer", "lower", "says"),
    [
        (24.5, 23.7, True, "llama.cpp 1.03× faster"),  # a 3% gap is not "1.0×"
        (23.1, 25.1, True, "longmoe 1.09× faster"),
        (59.4, 112.3, True, "longmoe 1.9× faster"),
        (220.0, 120.0, False, "longmoe 1.8× faster"),  # tokens/s: higher is better
    ],
)
def test_faster_names_the_winner_with_enough_digits_to_see_the_gap(ours, peer, lower, says):
    from longmoe.report.cpu_peer_headlines import _faster

    assert _faster(ours, peer, "llama.cpp", lower) == says


def test_agent_headline_is_the_paired_rl_minus_sft_beside_sft_with_the_seed_spread():
    from longmoe.report.headlines import _agent

    agent = {
        "config": {"env": "calculator"},
        "evals": {"sft": [{"success": 0.4, "episodes": 100}, {"success": 0.2, "episodes": 100}]},
        "paired_rl_minus_sft": {"diff": 0.05, "se": 0.02, "tasks": 200, "rl_seeds": 3},
        "rl_seed_success": {"per_seed": {"a": 0.33, "b": 0.35, "c": 0.37}, "mean": 0.35, "seed_sd": 0.02},
        "rl_lr": {"lr": 5e-5, "validation_success": {"2e-05": 0.4, "5e-05": 0.45}},
    }
    [h] = _agent(agent)
    assert h.value == "+5.0 ± 2.0" and h.baseline == "SFT 30.0%; RL mean of 3 seed(s) 35.0%"
    assert "200 test tasks" in h.noise and "SD 2.0 points" in h.noise and "5e-05 chosen" in h.noise
    one = {**agent, "paired_rl_minus_sft": None, "rl_seed_success": {"per_seed": {"a": 0.3}, "mean": 0.3}}
    [h1] = _agent(one)
    assert h1.value == "+0.0" and "unpaired" in h1.noise and "one RL seed" in h1.noise


def test_a_merged_cpu_serve_file_names_the_commit_of_the_run_its_headlines_come_from(tmp_path):
    """`bench.cpu_serve --merge` keeps an older thread count's run beside a new one: the README's source
    column must name the commit that measured the numbers shown (the widest thread count's run), not the
    file's newest provenance."""
    arms = ("longmoe fp32 --compile", "longmoe int8 --compile", "llama.cpp f32", "llama.cpp q8_0")
    row = {a: [1.0, 1.1, 1.2] for a in arms}
    measured = {"decode": {"1024": row, "16384": row}, "prefill": {"8192": row}}
    d = {
        "provenance": {"commit": "new0001"},
        "model": {"label": "~15M"},
        "runs": {
            "1": {"measured": measured, "commit": "new0001"},
            "2": {"measured": measured, "commit": "old0002"},
        },
    }
    _write(tmp_path, "cpu_serve_15m", d)
    rows = [line for line in headline_table(collect([tmp_path]), tmp_path).splitlines() if "~15M" in line]
    assert len(rows) == 6 and all("(old0002)" in line for line in rows)
