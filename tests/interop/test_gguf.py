"""``longmoe convert --to-gguf``: llama.cpp ``kimi-linear`` GGUF files that read back with every tensor
and key as exported, refusals as one-line errors, and an atomic write."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from longmoe.cli import main
from longmoe.interop.kimi_config import config_from_hf
from longmoe.interop.kimi_linear import to_hf
from longmoe.model import LongMoE
from longmoe.presets import preset
from tests.helpers.tokenizer import tokenizer_for_tests

gguf = pytest.importorskip("gguf")
from longmoe.interop.gguf_export import GGUF_ARCH, to_gguf  # noqa: E402

VOCAB = 512
HF = {  # a tiny Kimi-Linear: KDA and MLA heads alike (llama.cpp has one head count), rows of 64 for q8_0
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 5,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "kv_lora_rank": 32,
    "q_lora_rank": None,  # llama.cpp's kimi-linear graph has one attn_q matrix
    "qk_rope_head_dim": 8,
    "mla_use_nope": True,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "num_experts_per_token": 3,
    "num_experts": 8,
    "num_expert_group": 4,
    "topk_group": 2,
    "num_shared_experts": 2,
    "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 1,
    "model_max_length": 4096,
    "rms_norm_eps": 1e-5,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3, 5],
        "full_attn_layers": [4],
        "head_dim": 16,
        "num_heads": 2,
        "short_conv_kernel_size": 4,
    },
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random longmoe model with Kimi-Linear's options, norms and biases randomised, and a tokenizer."""
    d = tmp_path_factory.mktemp("gguf") / "kimi-tiny"
    torch.manual_seed(0)
    model = LongMoE(config_from_hf(HF)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".A"):
                p.copy_(torch.empty_like(p).uniform_(1.0, 16.0).log())
    model.save_pretrained(d)
    tokenizer_for_tests(VOCAB).save(d)
    return d


@pytest.fixture(scope="module")
def exported(model_dir, tmp_path_factory):
    """The f32, f16 and q8_0 files, each opened with ``GGUFReader``."""
    out = tmp_path_factory.mktemp("files")
    files = {}
    for t in ("f32", "f16", "q8_0"):
        to_gguf(model_dir, out / f"m-{t}.gguf", outtype=t)
        files[t] = gguf.GGUFReader(out / f"m-{t}.gguf")
    return files


def _array(t) -> np.ndarray:
    """A reader tensor as float32, in the numpy shape it was written with (ggml ``ne`` reversed)."""
    shape = tuple(int(x) for x in reversed(t.shape))
    if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    return gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)


def _field(reader, key):
    return reader.fields[key].contents()


def _expected(model_dir, tmp_path) -> dict[str, np.ndarray]:
    """The llama.cpp tensors, built from the transformers export (``--to-hf``, itself tested)."""
    to_hf(model_dir, tmp_path / "hf")
    hf = {k: v.float() for k, v in load_file(tmp_path / "hf" / "model.safetensors").items()}
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    H, Dq, Dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    plain = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "self_attn.b_proj.weight": "ssm_beta.weight",
        "self_attn.f_a_proj.weight": "ssm_f_a.weight",
        "self_attn.f_b_proj.weight": "ssm_f_b.weight",
        "self_attn.g_a_proj.weight": "ssm_g_a.weight",
        "self_attn.g_b_proj.weight": "ssm_g_b.weight",
        "self_attn.dt_bias": "ssm_dt.bias",
        "self_attn.o_norm.weight": "ssm_norm.weight",
        "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
        "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
        "block_sparse_moe.gate.e_score_correction_bias": "exp_probs_b.bias",
        "block_sparse_moe.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
        "block_sparse_moe.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
        "block_sparse_moe.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
        "block_sparse_moe.gate_proj.weight": "ffn_gate.weight",
        "block_sparse_moe.up_proj.weight": "ffn_up.weight",
        "block_sparse_moe.down_proj.weight": "ffn_down.weight",
    }
    exp = {
        "token_embd.weight": hf["model.embed_tokens.weight"],
        "output_norm.weight": hf["model.norm.weight"],
        "output.weight": hf["lm_head.weight"],
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for src, dst in plain.items():
            if p + src in hf:
                exp[f"blk.{i}.{dst}"] = hf[p + src]
        for n in "qkv":
            if f"{p}self_attn.{n}_conv1d.weight" in hf:
                w = hf[f"{p}self_attn.{n}_conv1d.weight"]  # [HK, 1, W]
                exp[f"blk.{i}.ssm_conv1d_{n}.weight"] = w.reshape(1, w.shape[0], 1, w.shape[2])
        if p + "self_attn.A_log" in hf:
            exp[f"blk.{i}.ssm_a"] = -hf[p + "self_attn.A_log"].exp()
        if p + "self_attn.kv_b_proj.weight" in hf:
            kv = hf[p + "self_attn.kv_b_proj.weight"].reshape(H, Dq + Dv, -1)
            exp[f"blk.{i}.attn_k_b.weight"] = kv[:, :Dq].transpose(1, 2)
            exp[f"blk.{i}.attn_v_b.weight"] = kv[:, Dq:]
        for w, dst in (("w1", "ffn_gate_exps"), ("w3", "ffn_up_exps"), ("w2", "ffn_down_exps")):
            key = f"{p}block_sparse_moe.experts.0.{w}.weight"
            if key in hf:
                stack = [hf[f"{p}block_sparse_moe.experts.{e}.{w}.weight"] for e in range(cfg["num_experts"])]
                exp[f"blk.{i}.{dst}.weight"] = torch.stack(stack)
    return {k: v.numpy() for k, v in exp.items()}


def test_f32_file_holds_every_tensor_exactly_under_llama_cpp_names(model_dir, exported, tmp_path):
    expected = _expected(model_dir, tmp_path)
    got = {t.name: t for t in exported["f32"].tensors}
    assert set(got) == set(expected)
    allowed = {
        gguf.TENSOR_NAMES[k].format(bid=i)
        for k in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.KIMI_LINEAR]
        for i in range(5)
    }
    assert {n.rsplit(".", 1)[0] if n.endswith((".weight", ".bias")) else n for n in got} <= allowed
    for name, want in expected.items():
        assert got[name].tensor_type == gguf.GGMLQuantizationType.F32, name
        a = _array(got[name])
        assert a.shape == want.shape, name
        assert np.array_equal(a, want), name


def test_f16_and_q8_0_read_back_within_their_rounding(exported):
    ref = {t.name: _array(t) for t in exported["f32"].tensors}
    f16 = {t.name: t for t in exported["f16"].tensors}
    q8 = {t.name: t for t in exported["q8_0"].tensors}
    assert set(f16) == set(q8) == set(ref)
    n_q8 = 0
    as_f16 = lambda x: x.astype(np.float16).astype(np.float32)
    for name, want in ref.items():
        a = _array(f16[name])
        if want.ndim == 1:
            assert f16[name].tensor_type == q8[name].tensor_type == gguf.GGMLQuantizationType.F32, name
        f32 = f16[name].tensor_type == gguf.GGMLQuantizationType.F32
        assert np.array_equal(a, want if f32 else as_f16(want)), name
        b = _array(q8[name])
        if q8[name].tensor_type == gguf.GGMLQuantizationType.Q8_0:
            n_q8 += 1
            blocks = want.reshape(-1, 32)
            bound = np.abs(blocks).max(axis=1, keepdims=True) / 127 * 0.5 + 1e-3 * np.abs(
                blocks
            )  # half a step
            err = np.abs(b.reshape(-1, 32) - blocks)
            assert (err <= bound + 1e-6).all(), (name, float(err.max()))
        elif q8[name].tensor_type == gguf.GGMLQuantizationType.F16:
            assert np.array_equal(b, as_f16(want)), name
        else:
            assert np.array_equal(b, want), name
    assert n_q8 > 20  # the matrices with rows of 64 or 32
    for name in ("blk.0.ssm_a", "blk.0.ssm_conv1d_q.weight", "blk.1.ffn_gate_inp.weight"):
        assert q8[name].tensor_type == gguf.GGMLQuantizationType.F32, name


def test_metadata_is_what_llama_cpp_kimi_linear_reads(exported, model_dir):
    r = exported["q8_0"]
    a = GGUF_ARCH
    want = {
        "general.architecture": "kimi-linear",
        "general.file_type": int(gguf.LlamaFileType.MOSTLY_Q8_0),
        f"{a}.block_count": 5,
        f"{a}.context_length": 4096,
        f"{a}.embedding_length": 64,
        f"{a}.feed_forward_length": 96,
        f"{a}.vocab_size": VOCAB,
        f"{a}.attention.head_count": 2,
        f"{a}.attention.head_count_kv": [0, 0, 0, 1, 0],
        f"{a}.attention.kv_lora_rank": 32,
        f"{a}.attention.key_length": 32 + 8,
        f"{a}.attention.value_length": 32,
        f"{a}.attention.key_length_mla": 16 + 8,
        f"{a}.attention.value_length_mla": 16,
        f"{a}.rope.dimension_count": 8,
        f"{a}.ssm.conv_kernel": 4,
        f"{a}.kda.head_dim": 16,
        f"{a}.expert_count": 8,
        f"{a}.expert_used_count": 3,
        f"{a}.expert_group_count": 4,
        f"{a}.expert_group_used_count": 2,
        f"{a}.expert_feed_forward_length": 32,
        f"{a}.expert_shared_count": 2,
        f"{a}.leading_dense_block_count": 1,
        f"{a}.expert_gating_func": int(gguf.ExpertGatingFuncType.SIGMOID),
        f"{a}.expert_weights_norm": True,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
    }
    assert f"{a}.attention.q_lora_rank" not in r.fields
    for key, value in want.items():
        assert key in r.fields, key
        assert _field(r, key) == value, key
    assert math.isclose(_field(r, f"{a}.expert_weights_scale"), 2.446, rel_tol=1e-6)
    assert math.isclose(_field(r, f"{a}.attention.layer_norm_rms_epsilon"), 1e-5, rel_tol=1e-6)
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    assert len(tokens) == len(types) == VOCAB
    for s, i in spec["model"]["vocab"].items():
        assert tokens[i] == s
    assert tokens[:3] == ["<|pad|>", "<|bos|>", "<|eos|>"] and types[:3] == [gguf.TokenType.CONTROL] * 3
    assert types[100] == gguf.TokenType.NORMAL
    merges = _field(r, "tokenizer.ggml.merges")
    assert len(merges) == len(spec["model"]["merges"]) and all(m.count(" ") == 1 for m in merges)


def test_unsupported_option_is_a_one_line_cli_error(tmp_path, capsys):
    LongMoE(preset("tiny")).save_pretrained(tmp_path / "tiny")  # bounded gate, attention residuals, ...
    out = tmp_path / "x.gguf"
    assert main(["convert", "--to-gguf", str(tmp_path / "tiny"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("longmoe convert: error: cannot export to GGUF kimi-linear") and "\n" not in err
    assert "kda_gate" in err and not out.exists()
    cfg = config_from_hf({**HF, "linear_attn_config": {**HF["linear_attn_config"], "num_heads": 4}})
    LongMoE(cfg).save_pretrained(tmp_path / "heads")
    assert main(["convert", "--to-gguf", str(tmp_path / "heads"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "kda_heads" in err and "\n" not in err
    LongMoE(config_from_hf({**HF, "q_lora_rank": 32})).save_pretrained(tmp_path / "q-lora")
    assert main(["convert", "--to-gguf", str(tmp_path / "q-lora"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "mla_q_lora_rank = 32" in err and "attn_q" in err and "\n" not in err


def test_bad_outtype_is_an_argparse_error(model_dir, tmp_path, capsys):
    args = ["convert", "--to-gguf", str(model_dir), "--out", str(tmp_path / "m.gguf"), "--outtype", "q4_k"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "argument --outtype: invalid choice: 'q4_k'" in err and "usage:" in err
    assert not (tmp_path / "m.gguf").exists()
    assert (
        main(["convert", "--to-hf", str(model_dir), "--out", str(tmp_path / "hf"), "--outtype", "f16"]) == 2
    )
    assert "--outtype applies to --to-gguf only" in capsys.readouterr().err


def test_export_is_atomic_and_a_failure_keeps_the_old_file(model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"previous")
    from longmoe.interop import gguf_export

    def boom(*a, **k):
        yield "token_embd.weight", torch.zeros(VOCAB, 64)
        raise ConnectionError("disk went away")

    monkeypatch.setattr(gguf_export, "gguf_tensors", boom)
    with pytest.raises(ConnectionError):
        to_gguf(model_dir, out)
    assert out.read_bytes() == b"previous" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]
    monkeypatch.undo()
    assert main(["convert", "--to-gguf", str(model_dir), "--out", str(out), "--outtype", "f16"]) == 0
    assert "f16" in capsys.readouterr().out
    assert gguf.GGUFReader(out).fields["general.architecture"].contents() == "kimi-linear"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_a_directory_without_tokenizer_is_refused(tmp_path, capsys):
    LongMoE(config_from_hf(HF)).save_pretrained(tmp_path / "weights-only")
    out = tmp_path / "m.gguf"
    assert main(["convert", "--to-gguf", str(tmp_path / "weights-only"), "--out", str(out)]) == 2
    assert "tokenizer.json" in capsys.readouterr().err and not out.exists()


def test_llama_cpp_logits_match_longmoe(model_dir, tmp_path):
    """llama-cpp-python on the f32 file against longmoe's fp32 forward, 64 token ids (runs wherever
    ``llama_cpp`` imports: ``pip install 'longmoe[cpu-peer]'``; a tiny model, a second or two)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = tmp_path / "m.gguf"
    to_gguf(model_dir, path, outtype="f32")
    torch.manual_seed(1)
    ids = torch.randint(12, VOCAB, (64,)).tolist()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=64, logits_all=True, verbose=False)
    llm.reset()
    llm.eval(ids)
    theirs = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
    with torch.no_grad():
        ours = LongMoE.from_pretrained(model_dir).float().eval()(torch.tensor([ids])).logits[0].numpy()
    delta = float(np.abs(theirs - ours).max())
    top1 = float((theirs.argmax(-1) == ours.argmax(-1)).mean())
    print(f"llama.cpp vs longmoe fp32, 64 tokens: max|dlogit| {delta:.3e}, top-1 agreement {top1:.3f}")
    assert top1 >= 0.95 and delta < 1e-2


def test_llama_cpp_tokenizes_a_corpus_sample_as_longmoe_does(model_dir, tmp_path):
    """The exported vocabulary, merges and pre-tokenizer make llama.cpp split text into the same ids as
    longmoe's tokenizer (30 standard-library files: code, prose, digits, whitespace runs, UTF-8)."""
    import itertools

    from longmoe.data.corpus import stdlib_documents
    from longmoe.data.tokenizer import Tokenizer

    llama_cpp = pytest.importorskip("llama_cpp")
    path = tmp_path / "m.gguf"
    to_gguf(model_dir, path, outtype="f32")
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    tok = Tokenizer.from_file(model_dir / "tokenizer.json")
    texts = [d.text for d in itertools.islice(stdlib_documents("val", "file"), 30)]
    texts.append("naïve café 日本語 — 12345 + 0.5e-3\t\n\n  x")
    for text in texts:
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
        assert theirs == tok.encode(text), text[:80]
