"""ModelConfig: validation names the field, JSON round trip, presets construct."""

import re
from dataclasses import dataclass, field

import pytest
import torch

from longmoe.config import ConfigError, FFNConfig, ModelConfig, VisionConfig
from longmoe.configio import JsonConfig, check_types, dataclass_from_dict
from longmoe.presets import preset


@pytest.mark.parametrize("name", ["tiny", "small", "flagship", "tiny-vision"])
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
        ({"ffn": FFNConfig(n_experts=8, n_group=3)}, "ffn.n_group"),
        ({"ffn": FFNConfig(n_experts=8, n_group=4, topk_group=5)}, "ffn.topk_group"),
        ({"ffn": FFNConfig(n_experts=8, top_k=3, n_group=4, topk_group=1)}, "ffn.top_k"),
        ({"kda_out_gate_rank": -1}, "kda_out_gate_rank"),
        ({"mla_q_lora_rank": -2}, "mla_q_lora_rank"),
        ({"kda_l2_eps": 0.0}, "kda_l2_eps"),
        ({"mla_norm_eps": -1e-6}, "mla_norm_eps"),
        ({"mla_gate": 1}, "mla_gate"),
        ({"mla_logn_scale": -0.1}, "mla_logn_scale"),
        ({"mla_logn_scale": float("inf")}, "mla_logn_scale"),
        ({"mla_logn_scale": float("nan")}, "mla_logn_scale"),
        ({"mla_logn_scale": True}, "mla_logn_scale"),
        ({"vision": VisionConfig(patch_size=0)}, "vision.patch_size"),
        ({"vision": VisionConfig(patch_size=8, max_image_side=100)}, "vision.max_image_side"),
        ({"vision": VisionConfig(encoder="cnn")}, "vision.encoder"),
        ({"vision": VisionConfig(encoder="vit", width=100, heads=3)}, "vision.width"),
        ({"vision": VisionConfig(depth=1.5)}, "vision.depth"),
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


def test_wrong_types_name_the_field_and_the_expected_type():
    """A string where a float is expected says so (not a bare TypeError from a comparison)."""
    with pytest.raises(ConfigError, match=r"'g_min' = 'x' is invalid: expected a float"):
        ModelConfig.from_dict({"g_min": "x"})
    with pytest.raises(ConfigError, match=r"'ffn.top_k' = '2' is invalid: expected an integer"):
        ModelConfig.from_dict({"ffn": {"top_k": "2"}})
    with pytest.raises(ConfigError, match=r"'attn_res' = 1 is invalid: expected a boolean"):
        ModelConfig(attn_res=1)
    with pytest.raises(ConfigError, match=r"'d_model' = True is invalid: expected an integer"):
        ModelConfig(d_model=True)
    assert ModelConfig(g_min=-4).g_min == -4  # an integer is a valid float


def test_load_names_the_file(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"ffn": {"n_expert": 3}}')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(f))}: unknown config field.*ffn.n_expert"):
        ModelConfig.load(f)
    f.write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        ModelConfig.load(f)
    f.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON object, got list"):
        ModelConfig.load(f)
    with pytest.raises(FileNotFoundError, match="config file not found"):
        ModelConfig.load(tmp_path / "missing.json")


@dataclass
class _Leaf:
    x: float = 1.0
    tags: list[str] = field(default_factory=list)


@dataclass
class _Tree(JsonConfig):
    leaves: list[_Leaf] = field(default_factory=list)
    best: _Leaf | None = None
    name: str = "t"


def test_dataclass_from_dict_builds_nested_configs_and_round_trips(tmp_path):
    t = dataclass_from_dict(_Tree, {"leaves": [{"x": 2}, {"tags": ["a"]}], "best": {"x": 0.5}})
    assert t == _Tree([_Leaf(2), _Leaf(tags=["a"])], _Leaf(0.5))
    t.save(tmp_path / "t.json")
    assert _Tree.load(tmp_path / "t.json") == t
    with pytest.raises(ConfigError, match=r"^f.json: unknown config field\(s\) \['leaves\[1\].y'\]"):
        dataclass_from_dict(_Tree, {"leaves": [{}, {"y": 1}]}, where="f.json")
    with pytest.raises(ConfigError, match=r"^unknown config field\(s\) \['best.z'\]"):
        _Tree.from_dict({"best": {"z": 1}})
    leaf = _Leaf(x="big")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'leaf.x' = 'big' is invalid: expected a float"):
        check_types(leaf, "leaf.")
    with pytest.raises(
        ConfigError, match=r"'tags' = \['a', 1\] is invalid: expected a list, each item a string"
    ):
        check_types(_Leaf(tags=["a", 1]))  # type: ignore[list-item]


def test_kimi_linear_options_build_and_keep_defaults():
    """The options Kimi-Linear import needs are off by default; turned on they build a model whose
    parameter count matches the layers' formulas (used by ``longmoe inspect``)."""
    from longmoe.accounting import param_counts
    from longmoe.model import LongMoE

    d = ModelConfig()
    assert (d.kda_gate, d.kda_out_gate_rank, d.kda_l2_eps, d.mla_gate, d.mla_norm_eps) == (
        "bounded", 0, None, True, None,
    )  # fmt: skip
    assert (d.ffn.n_group, d.ffn.topk_group) == (1, 1)
    cfg = preset("tiny").replace(
        kda_gate="kimi", kda_out_gate_rank=8, kda_l2_eps=1e-6, mla_q_lora_rank=0, mla_gate=False,
        mla_norm_eps=1e-6, attn_res=False,
        ffn=FFNConfig(kind="moe", n_experts=8, top_k=2, n_group=4, topk_group=2, first_k_dense=1,
                      latent_ratio=1, expert_hidden=32, shared_hidden=32),
    )  # fmt: skip
    model = LongMoE(cfg)
    assert model.num_parameters() == sum(param_counts(cfg).values())
    out = model(torch.randint(0, cfg.vocab_size, (1, 40)))
    assert torch.isfinite(out.logits).all()


def test_vision_config_json_round_trip_and_old_configs_load(tmp_path):
    """``vision`` is null for text-only models, so a config.json written before it existed loads
    unchanged; a vision config round-trips through the shared config I/O and names its bad fields."""
    old = preset("tiny").to_dict()
    del old["vision"]
    assert ModelConfig.from_dict(old) == preset("tiny") and preset("tiny").vision is None
    cfg = preset("tiny").replace(vision=VisionConfig(patch_size=16, max_image_side=512, encoder="vit"))
    cfg.save(tmp_path / "config.json")
    back = ModelConfig.load(tmp_path / "config.json")
    assert back == cfg and isinstance(back.vision, VisionConfig)
    d = cfg.to_dict()
    d["vision"]["patch_sise"] = 3
    with pytest.raises(ConfigError, match="vision.patch_sise"):
        ModelConfig.from_dict(d)
    d["vision"] = {"max_image_side": "big"}
    with pytest.raises(ConfigError, match="'vision.max_image_side'"):
        ModelConfig.from_dict(d)


def test_vision_resize_rule():
    v = VisionConfig(patch_size=14, max_image_side=896)
    assert v.resized_size(896, 896) == (896, 896) and v.image_tokens(896, 896) == 64 * 64 + 2
    assert v.resized_size(2200, 1700) == (896, 686)  # 1700 * 896/2200 = 692.4 -> 49 patches
    assert v.resized_size(5, 3000) == (14, 896)  # at least one patch
    with pytest.raises(ValueError, match="positive integer sides"):
        v.resized_size(0, 10)
