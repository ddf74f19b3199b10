"""ModelConfig: validation names the field, JSON round trip, presets construct."""

import pytest

from longmoe.config import ConfigError, FFNConfig, ModelConfig, preset


@pytest.mark.parametrize("name", ["tiny", "small", "flagship"])
def test_presets_validate_and_round_trip(name, tmp_path):
    cfg = preset(name)
    cfg.save(tmp_path / "config.json")
    assert ModelConfig.load(tmp_path / "config.json") == cfg


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"layer_pattern": "LXM"}, "layer_pattern"),
        ({"layer_pattern": "LLLM", "n_layers": 6}, "layer_pattern"),
        ({"g_min": 0.0}, "g_min"),
        ({"d_model": 0}, "d_model"),
        ({"kda_gate": "relu"}, "kda_gate"),
        ({"dtype": "float16"}, "dtype"),
        ({"ffn": FFNConfig(kind="moe", n_experts=4, top_k=8)}, "ffn.top_k"),
        ({"ffn": FFNConfig(balancer="magic")}, "ffn.balancer"),
        ({"ffn": FFNConfig(latent_ratio=3)}, "ffn.latent_ratio"),
    ],
)
def test_bad_configs_name_the_field(changes, field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        ModelConfig(**changes)


def test_unknown_fields_rejected():
    with pytest.raises(ConfigError, match="unknown config field"):
        ModelConfig.from_dict({"d_modle": 3})
    with pytest.raises(ConfigError, match="ffn.n_expert"):
        ModelConfig.from_dict({"ffn": {"n_expert": 3}})


def test_layer_pattern_repeats():
    assert ModelConfig(n_layers=8, layer_pattern="LLLM").layer_types == list("LLLMLLLM")
