"""Every report-card headline names the model it measured and its size, and says honestly how noisy it
is (issue 50: "every headline with model size, peer setting, interval"); the names come from the result
file where it records them (longmoe/report/measured.py)."""

from __future__ import annotations

import re

import pytest

from longmoe.report import card, measured
from longmoe.report.headlines import HEADLINES

RESULTS = [r for r in card.collect(card.default_dirs()) if not r.smoke and r.name in HEADLINES]
BOUNDS = re.compile(r"\[[^\]]*\d[^\]]*\]|±|\d-\d")  # [lo, hi], ± se, or lo-hi


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: r.name)
def test_every_headline_of_a_committed_result_names_its_model_and_size(result):
    hs = card.headlines(result)
    assert hs, f"{result.path.name}: a HEADLINES section that yields no headline"
    for h in hs:
        assert h.model.strip() and h.model != card.NOT_RECORDED, (
            f"{result.path.name}: {h.label!r} names no model"
        )
        assert re.search(r"\d", h.model), f"{result.path.name}: {h.label!r} model {h.model!r} gives no size"


@pytest.mark.parametrize("result", RESULTS, ids=lambda r: r.name)
def test_a_headline_marked_range_or_interval_prints_its_bounds_and_one_sample_claims_neither(result):
    for h in card.headlines(result):
        if h.noise_kind in ("range", "interval"):
            assert BOUNDS.search(h.value + " " + h.noise), f"{result.path.name}: {h.label!r} shows no bounds"
        if "one sample" in h.noise:
            assert h.noise_kind == "", f"{result.path.name}: {h.label!r} is one sample marked {h.noise_kind}"


def test_the_checks_above_run_over_the_committed_benchmark_results():
    assert {r.name for r in RESULTS} >= {"kda", "serve", "moe", "packed_attention", "rollout", "load"}


def test_command_flag_reads_a_flags_value_and_is_none_without_one():
    d = {"provenance": {"command": "python -m bench.quant --model runs/demo --docs 4"}}
    assert measured.command_flag(d, "--model") == "runs/demo"
    assert measured.command_flag(d, "--compile-model") is None
    assert measured.command_flag({"provenance": {"command": "x --model"}}, "--model") is None
    assert measured.command_flag({}, "--model") is None


def test_a_benchmark_model_is_named_from_the_files_config_and_else_from_its_script():
    cfg = {
        "d_model": 256,
        "n_layers": 4,
        "layer_pattern": "LM",
        "ffn": {"kind": "moe", "n_experts": 16, "top_k": 4},
    }
    assert measured.tiny_engine_model({"config": cfg}, "bench/x.py") == (
        "tiny-preset shapes (d_model 256, 4 layers LM, 16 experts top-4), random weights"
    )
    assert "bench/x.py, no config in the file" in measured.tiny_engine_model(
        {"config": {"turns": 8}}, "bench/x.py"
    )
    assert measured.kda_model({"shape": {"B": 2, "H": 8, "K": 32, "V": 64, "C": 64}}) == (
        "KDA operator alone, B=2 H=8 K=32 V=64, chunk 64"
    )


def test_sizes_are_read_from_the_file_and_a_missing_count_is_said_not_guessed():
    quant = {"variants": {"fp32": {"weight_bytes": {"total": 4 * 1_000_000}}}}
    assert "1,000,000 parameters" in measured.quant_model(quant)
    assert measured.NO_COUNT in measured.quant_model({"variants": {}})
    vision = {
        "config": {"d_model": 32, "n_layers": 1, "layer_pattern": "M", "patch_size": 4},
        "main": {"params": 5},
    }
    assert measured.vision_model(vision) == (
        "image → JSON extractor (conv encoder, 4-px patches, decoder d_model 32, 1 layers M), 5 parameters"
    )
    old = measured.vision_model({"seed": 1})
    assert "the recipe's defaults" in old and old.endswith(measured.NO_COUNT)
    models = [{"cell": {"pattern": p}, "train": {"params": n}} for p, n in (("LM", 10), ("LM", 12), ("L", 7))]
    assert measured.mqar_params({"models": models}, "LM") == "10-12 parameters"
    assert measured.mqar_params({"models": models}, "L") == "7 parameters"
    assert measured.mqar_params({"models": models}, "M") == measured.NO_COUNT
