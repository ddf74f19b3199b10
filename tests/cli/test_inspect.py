"""`longmoe inspect`: analytic counts equal real modules; flagship lands on the seeds' scale."""

from __future__ import annotations

import json

import pytest

from longmoe.accounting import param_counts
from longmoe.cli.inspect import format_report, report
from longmoe.config import FFNConfig, VisionConfig
from longmoe.memory import cache_accounting
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.budget import CacheSpec


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"tie_embeddings": False},
        {"attn_res": False},
        {"layer_pattern": "LM"},
        {"ffn": FFNConfig(kind="moe", n_experts=4, top_k=1, n_shared=0, latent_ratio=1, expert_hidden=32)},
        {"vision": VisionConfig()},
        {"vision": VisionConfig(encoder="vit", width=64, depth=3, heads=2, mlp_ratio=2)},
    ],
)
def test_counts_equal_instantiated_tiny(changes):
    """Analytic total == the instantiated model's parameter count (tiny and variants)."""
    cfg = preset("tiny").replace(**changes)
    assert sum(param_counts(cfg).values()) == LongMoE(cfg).num_parameters()


def test_tiny_dense_counts_and_active_equals_total():
    """Without MoE every parameter is active."""
    cfg = preset("tiny-dense")
    r = report(cfg)
    assert r["total_params"] == LongMoE(cfg).num_parameters() == r["active_params"]


def test_flagship_lands_on_seed_scale():
    """Flagship: within 5% of 2.8T total and 104B active, 896 experts, 1M context."""
    cfg = preset("flagship")
    r = report(cfg)
    assert abs(r["total_params"] / 2.8e12 - 1) < 0.05
    assert abs(r["active_params"] / 104e9 - 1) < 0.05
    assert cfg.ffn.n_experts == 896 and cfg.max_seq_len == 1 << 20


def test_vision_accounting_tiny_and_flagship(capsys):
    """Vision parameters = the instantiated encoder (tiny-vision); the flagship's assumed 0.4B ViT and its
    4096-patch images; image tokens agree with data/images (the shared resize rule)."""
    from longmoe.data.images import image_tokens

    cfg = preset("tiny-vision")
    r = report(cfg)
    m = LongMoE(cfg)
    assert r["params"]["vision"] == sum(p.numel() for p in m.vision.parameters()) > 0
    assert r["total_params"] == m.num_parameters()
    assert r["vision"]["image_tokens"]["max (120x120)"]["tokens"] == 15 * 15 + 2
    assert r["vision"]["image_tokens"]["640x480 photo"]["tokens"] == image_tokens(480, 640, cfg.vision)
    f = report(preset("flagship"))
    assert 0.3e9 < f["params"]["vision"] < 0.5e9 and f["active"]["vision"] == 0  # text tokens skip it
    assert f["vision"]["max_patches"] == 64 * 64
    assert f["vision"]["image_tokens"]["max (896x896)"]["tokens"] == 4098
    assert report(preset("tiny"))["vision"] is None and report(preset("tiny"))["params"]["vision"] == 0
    assert "vision: vit encoder" in format_report(f, "flagship")


def test_cache_accounting_formula():
    """Latent bytes = n_MLA·d_c·2; KDA = n_KDA·(H·K·V·4 + (W-1)·3HK·2); context totals add up."""
    cfg = preset("tiny")
    c = cache_accounting(cfg)
    assert c["mla_latent_bytes_per_token"] == 2 * 32 * 2
    assert c["kda_state_bytes_per_sequence"] == 6 * (2 * 32 * 32 * 4 + 3 * 3 * 64 * 2)
    ctx = c["contexts"]["8K"]
    assert ctx["hybrid_bytes"] == c["kda_state_bytes_per_sequence"] + 8192 * c["mla_latent_bytes_per_token"]
    assert ctx["full_mha_bytes"] == 8192 * 2 * 8 * 128 * 2


def test_real_cache_matches_accounting():
    """A real fp32 tiny cache after n tokens: latent part grows by n·n_MLA·d_c·4 bytes."""
    import torch

    cfg = preset("tiny-dense")
    m = LongMoE(cfg).eval()
    cache = m.new_cache(1)
    base = cache.nbytes()
    with torch.no_grad():
        m(torch.zeros(1, 10, dtype=torch.long), cache=cache)
    assert cache.nbytes() - base == 10 * 2 * cfg.mla_kv_lora_rank * 4


def test_shared_key_part_is_counted_in_the_cache():
    """With mla_shared_key_dim the MLA cache row is d_c + d_r wide: inspect's bf16 bytes per token, a real
    bf16 cache's per-token spec and the serving budget's spec (built from it) all count it."""
    base = preset("tiny-dense")
    cfg = base.replace(mla_shared_key_dim=16, dtype="bfloat16")
    c, c0 = cache_accounting(cfg), cache_accounting(base)
    assert c["mla_latent_bytes_per_token"] == 2 * (32 + 16) * 2
    assert c["mla_shared_key_bytes_per_token"] == 2 * 16 * 2 and c0["mla_shared_key_bytes_per_token"] == 0
    m = LongMoE(cfg)
    assert m.new_cache(1).spec().per_token == c["mla_latent_bytes_per_token"]
    assert CacheSpec.of(m).per_token == c["mla_latent_bytes_per_token"]
    assert "192 B/token (bf16; 64 of them the shared key part)" in format_report(report(cfg), "x")
    assert "shared key" not in format_report(report(base), "x")


def test_cli_json_and_text(capsys, tmp_path):
    """--json prints total_params/active_params; --config reads a file; a bad config exits 2."""
    from longmoe.cli import main

    assert main(["inspect", "--preset", "flagship", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["total_params"] == report(preset("flagship"))["total_params"] and "active_params" in d
    assert set(d["cache"]["contexts"]) == {"8K", "128K", "1M"}
    preset("tiny").save(tmp_path / "config.json")
    assert main(["inspect", "--config", str(tmp_path / "config.json")]) == 0
    out = capsys.readouterr().out
    assert "TOTAL" in out and "MLA latent cache" in out
    (tmp_path / "bad.json").write_text('{"d_model": -1}')
    assert main(["inspect", "--config", str(tmp_path / "bad.json")]) == 2
    assert "d_model" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tiny", "small", "flagship"])
def test_training_memory_counts_four_copies_of_the_weights(name, capsys):
    """Weights, gradients and AdamW's two moments, each in the config's dtype; shown by the command."""
    from longmoe.cli import main

    cfg = preset(name)
    m = report(cfg)["training_bytes"]
    per_copy = report(cfg)["total_params"] * {"float32": 4, "bfloat16": 2}[cfg.dtype]
    assert m == {"weights": per_copy, "gradients": per_copy, "optimizer": 2 * per_copy, "total": 4 * per_copy}
    assert main(["inspect", "--preset", name]) == 0
    assert "training memory: " in capsys.readouterr().out


def test_cli_quantize_reports_weight_footprint(capsys):
    """``inspect --quantize`` adds the weight bytes before/after (the tiny preset's equal a real
    quantized model's; the flagship's come from the meta device)."""
    from longmoe.cli import main
    from longmoe.quantize import quantize_model, weight_bytes

    assert main(["inspect", "--preset", "tiny", "--quantize", "int8", "--json"]) == 0
    w = json.loads(capsys.readouterr().out)["weights"]
    m = LongMoE(preset("tiny"))
    assert w["bytes"] == weight_bytes(m)["total"]
    quantize_model(m, "int8")
    assert w["int8"] == weight_bytes(m) and 0.3 < w["ratio"] < 0.4
    assert main(["inspect", "--preset", "flagship", "--quantize", "int4"]) == 0
    out = capsys.readouterr().out
    assert "weights (bfloat16): 5.14 TiB" in out and "weights --quantize int4: 1.61 TiB" in out
