"""``longmoe convert`` against transformers' Kimi-Linear: a tiny random ``KimiLinearForCausalLM`` is saved
(sharded), converted, and must give the same logits (max |Δ| < 1e-4 in fp32) for the full forward, for
prefill + token-by-token decode through the model cache and the serving engine, and after export back
to transformers. Twice: without a "rotary" key part (``pair``) and with ``qk_rope_head_dim > 0`` as the
released checkpoints have (``shared_pair``: the un-rotated key part shared by all heads, which longmoe
caches beside the latent as ``mla_shared_key_dim``)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from longmoe.accounting import param_counts
from longmoe.checkpoint import load_model
from longmoe.config import ModelConfig
from longmoe.interop.kimi_config import ConversionError, config_from_hf, config_to_hf, hf_layer_types
from longmoe.interop.kimi_linear import RECORD_FILE, from_hf, to_hf
from longmoe.layers.mla import DECODE_PATHS
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from tests.helpers.kimi import PROMPT_LENGTHS, VOCAB, hf_config, hf_model, save_hf

pytest.importorskip("transformers")
TOL = 1e-4
SHARED_KEY_DIM = 8  # qk_rope_head_dim of shared_pair (the released checkpoints: 64 next to nope 128)
PAIRS = ("pair", "shared_pair")


def _convert(root, **overrides):
    hf = hf_model(**overrides)
    save_hf(hf, root / "hf")
    from_hf(root / "hf", root / "lm")
    return hf, LongMoE.from_pretrained(root / "lm").eval(), root


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(transformers model, its converted longmoe model, the two directories)."""
    return _convert(tmp_path_factory.mktemp("kimi"))


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory):
    """``pair`` with ``qk_rope_head_dim > 0``: q heads ``nope + rope`` wide, ``kv_a_proj_with_mqa`` giving the
    latent and a key part shared by all heads (no rotation in transformers' Kimi-Linear)."""
    return _convert(tmp_path_factory.mktemp("kimi_shared"), qk_rope_head_dim=SHARED_KEY_DIM)


def _prompts(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, n), generator=g) for n in PROMPT_LENGTHS]


@pytest.mark.parametrize("which", PAIRS)
def test_config_maps_the_checkpoint(which, request):
    _, lm, root = request.getfixturevalue(which)
    cfg = lm.cfg
    assert cfg.layer_pattern == "LLLML"  # kda_layers [1, 2, 3, 5], full_attn_layers [4]: 1-indexed
    assert (cfg.kda_gate, cfg.attn_res, cfg.mla_gate, cfg.ffn.latent_ratio) == ("kimi", False, False, 1)
    assert (cfg.ffn.n_group, cfg.ffn.topk_group, cfg.ffn.top_k, cfg.ffn.first_k_dense) == (4, 2, 3, 1)
    assert cfg.ffn.routed_scale == pytest.approx(2.446)
    assert (cfg.ffn.n_shared, cfg.ffn.shared_hidden) == (2, 24)
    assert len(list((root / "hf").glob("model-*.safetensors"))) > 1  # the source really was sharded
    assert lm.num_parameters() == sum(param_counts(cfg).values())  # `longmoe inspect` counts it right
    assert cfg.mla_shared_key_dim == (SHARED_KEY_DIM if which == "shared_pair" else 0)


@pytest.mark.parametrize("which", PAIRS)
def test_full_forward_matches(which, request):
    hf, lm, _ = request.getfixturevalue(which)
    for x in _prompts():
        with torch.no_grad():
            a, b = hf(x).logits, lm(x).logits
        assert a.abs().max() > 1.0  # logits large enough for the tolerance to mean something
        assert (a - b).abs().max().item() < TOL, x.shape


def test_bias_and_grouping_change_routing(pair):
    """The score-correction bias and the group restriction are live: dropping either changes logits."""
    hf, lm, _ = pair
    x = _prompts()[3]
    with torch.no_grad():
        ref = lm(x).logits
        moe = lm.moe_layers()[0]
        saved = moe.bias.clone()
        moe.bias.zero_()
        no_bias = lm(x).logits
        moe.bias.copy_(saved)
        moe.cfg.n_group = 1
        ungrouped = lm(x).logits
        moe.cfg.n_group = 4
    assert (ref - no_bias).abs().max() > 1e-3
    assert (ref - ungrouped).abs().max() > 1e-3


@pytest.mark.parametrize("path", DECODE_PATHS)
@pytest.mark.parametrize("which", PAIRS)
def test_prefill_then_decode_through_the_cache(which, path, request):
    hf, lm, _ = request.getfixturevalue(which)
    lm.set_mla_decode(path)
    for x in _prompts(1)[2:]:
        with torch.no_grad():
            full = hf(x).logits
            split = x.shape[1] // 2
            out = lm(x[:, :split], use_cache=True)
            steps = [out.logits]
            for t in range(split, x.shape[1]):
                steps.append(lm(x[:, t : t + 1], cache=out.cache).logits)
        got = torch.cat(steps, dim=1)
        assert (full - got).abs().max().item() < TOL
    lm.set_mla_decode("absorbed")


@pytest.mark.parametrize("which", PAIRS)
def test_engine_greedy_decode_matches(which, request, make_engine):
    """Chunked prefill + batched decode in the serving engine: chosen tokens, their log-probs and the top-5
    alternatives equal transformers' full forward over prompt + completion."""
    hf, lm, _ = request.getfixturevalue(which)
    prompts = [p[0].tolist() for p in _prompts(2)[1:]]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=True, top_logprobs=5, ignore_eos=True)
    with make_engine(lm, prefill_chunk=8, max_batch=4) as eng:
        results = eng.generate_batch(prompts, params)
    for prompt, res in zip(prompts, results, strict=True):
        seq = torch.tensor([prompt + res.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(hf(seq).logits[0].double(), dim=-1)
        for j, tok in enumerate(res.token_ids):
            row = lp[len(prompt) - 1 + j]
            assert tok == int(row.argmax())
            assert abs(res.logprobs[j] - float(row[tok])) < TOL
            top = row.topk(5)
            assert [t for t, _ in res.top_logprobs[j]] == top.indices.tolist()
            assert max(abs(v - float(w)) for (_, v), w in zip(res.top_logprobs[j], top.values)) < TOL


@pytest.mark.parametrize("which", PAIRS)
def test_export_round_trip_loads_in_transformers(which, request, tmp_path):
    from transformers import KimiLinearForCausalLM

    hf, _, root = request.getfixturevalue(which)
    to_hf(root / "lm", tmp_path / "back")
    back = KimiLinearForCausalLM.from_pretrained(tmp_path / "back").eval()
    for x in _prompts(3):
        with torch.no_grad():
            assert (hf(x).logits - back(x).logits).abs().max().item() < TOL
    src, dst = hf.state_dict(), back.state_dict()
    assert sorted(src) == sorted(dst)
    assert all(torch.equal(src[k], dst[k]) for k in src)  # bit-exact weights


@pytest.mark.parametrize("which", PAIRS)
def test_runtime_layout_single_file(which, request, tmp_path):
    """transformers' runtime names (fused conv1d, forget_gate.*, mlp.experts.gate_up_proj) convert too."""
    hf, lm, root = request.getfixturevalue(which)
    d = tmp_path / "runtime"
    d.mkdir()
    (d / "config.json").write_text((root / "hf" / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in hf.state_dict().items()}, str(d / "model.safetensors"))
    from_hf(d, tmp_path / "lm")
    other = LongMoE.from_pretrained(tmp_path / "lm")
    a, b = lm.state_dict(), other.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_weights_only_directory_is_explained(pair):
    _, _, root = pair
    record = json.loads((root / "lm" / RECORD_FILE).read_text())
    assert record["tokenizer"].startswith("none:") and "weights-only" in record["tokenizer"]
    with pytest.raises(FileNotFoundError, match="weights-only"):
        load_model(root / "lm")  # the one loader (serve, chat, eval go through it)
    with pytest.raises(FileNotFoundError, match="weights-only"):
        Engine.from_dir(root / "lm")


def test_tied_head_exports_as_lm_head(tmp_path):
    cfg = config_from_hf(json.loads(hf_config().to_json_string())).replace(tie_embeddings=True)
    LongMoE(cfg).save_pretrained(tmp_path / "lm")
    hf_cfg = to_hf(tmp_path / "lm", tmp_path / "hf")
    assert hf_cfg["tie_word_embeddings"] is False
    from transformers import KimiLinearForCausalLM

    back = KimiLinearForCausalLM.from_pretrained(tmp_path / "hf").eval()
    lm = LongMoE.from_pretrained(tmp_path / "lm").eval()
    x = _prompts()[3]
    with torch.no_grad():
        assert (back(x).logits - lm(x).logits).abs().max().item() < TOL


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({}, "kda_gate"),  # the tiny preset: bounded gate
        ({"kda_gate": "kimi", "attn_res": True}, "attn_res"),
        ({"kda_gate": "kimi", "attn_res": False}, "ffn.latent_ratio"),
    ],
)
def test_export_names_what_kimi_linear_lacks(tmp_path, change, field):
    LongMoE(preset("tiny").replace(**change)).save_pretrained(tmp_path / "lm")
    with pytest.raises(ConversionError, match=field.replace(".", r"\.")):
        to_hf(tmp_path / "lm", tmp_path / "hf")


def test_layer_schedule_from_linear_attn_config():
    base = {"num_hidden_layers": 6}
    lac = {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3, 6]}
    assert hf_layer_types({**base, "linear_attn_config": lac}) == [
        "linear_attention", "linear_attention", "full_attention",
        "linear_attention", "linear_attention", "full_attention",
    ]  # fmt: skip
    assert hf_layer_types(base)[4] == "full_attention"  # transformers' default: every 4th from index 4
    with pytest.raises(ConversionError, match="layers \\[6\\]"):
        hf_layer_types({**base, "linear_attn_config": {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3]}})


def test_export_refuses_log_length_scaling():
    """Kimi-Linear's MLA scales no logits by length: a model trained with it cannot be exported as one."""
    cfg = config_from_hf(json.loads(hf_config().to_json_string()))
    config_to_hf(cfg)  # exportable as imported
    with pytest.raises(ConversionError, match="mla_logn_scale"):
        config_to_hf(cfg.replace(mla_logn_scale=0.25))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_key_value_heads", 1),
        ("moe_renormalize", False),
        ("hidden_act", "relu"),
    ],
)
def test_import_rejects_what_longmoe_cannot_express(field, value):
    hf = json.loads(hf_config().to_json_string())
    with pytest.raises(ConversionError, match=field):
        config_from_hf({**hf, field: value})


def test_rotated_key_part_is_refused_and_the_nope_one_is_the_shared_key():
    """``qk_rope_head_dim > 0`` is the shared key part only under NoPE (transformers, and Moonshot's
    ``mla_use_nope: true``); with rotation (``mla_use_nope: false``) the error names the field."""
    hf = json.loads(hf_config().to_json_string())
    for rope in (64, 0):
        with pytest.raises(ConversionError, match="qk_rope_head_dim" if rope else "mla_use_nope"):
            config_from_hf({**hf, "qk_rope_head_dim": rope, "mla_use_nope": False})
    for extra in ({}, {"mla_use_nope": True}):  # transformers' config has no such field: NoPE
        cfg = config_from_hf({**hf, "qk_rope_head_dim": 64, **extra})
        assert (cfg.mla_shared_key_dim, cfg.mla_head_dim) == (64, 16)
        back = config_to_hf(cfg)
        assert (back["qk_rope_head_dim"], back["qk_nope_head_dim"], back["mla_use_nope"]) == (64, 16, True)


@pytest.mark.parametrize("which", PAIRS)
def test_converted_config_round_trips_through_json(which, request, tmp_path):
    _, lm, _ = request.getfixturevalue(which)
    lm.cfg.save(tmp_path / "c.json")
    assert ModelConfig.load(tmp_path / "c.json") == lm.cfg


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda sd: sd.pop("model.norm.weight"), "missing, e.g. \\['model.norm.weight'\\]"),
        (
            lambda sd: sd.update({"model.mtp.0.weight": torch.zeros(2)}),
            "no place in longmoe.*model.mtp.0.weight",
        ),
        (
            lambda sd: sd.update({"model.norm.weight": torch.zeros(7)}),
            "model.norm.weight: expected shape \\[48\\]",
        ),
    ],
)
def test_incomplete_or_foreign_checkpoints_are_refused(pair, tmp_path, edit, message):
    """The error names the tensor, and no half-written model.safetensors is left behind."""
    hf, _, root = pair
    d = tmp_path / "src"
    d.mkdir()
    (d / "config.json").write_text((root / "hf" / "config.json").read_text())
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    edit(sd)
    save_file(sd, str(d / "model.safetensors"))
    with pytest.raises(ConversionError, match=message):
        from_hf(d, tmp_path / "lm")
    assert not (tmp_path / "lm" / "model.safetensors").exists()
