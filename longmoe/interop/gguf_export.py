"""Export a longmoe model directory as a GGUF file for llama.cpp's ``kimi-linear`` architecture.

The weights go through the same longmoe -> transformers map as ``--to-hf`` (``kimi_map``), then each
transformers tensor is renamed / reshaped the way llama.cpp's ``kimi-linear`` loader reads it:

- routed experts ``w1 | w3 | w2`` are stacked into ``ffn_{gate,up,down}_exps`` ``[E, f, d]`` / ``[E, d, f]``;
- ``kv_b_proj`` is split per head into ``attn_k_b [H, kv_lora_rank, nope]`` (transposed, for the absorbed
  MLA cache) and ``attn_v_b [H, v_head_dim, kv_lora_rank]``;
- ``A_log`` is stored as ``ssm_a = -exp(A_log)`` (llama.cpp multiplies by it directly);
- conv weights ``[HK, 1, W]`` become ``[1, HK, 1, W]`` (ggml ``ne = [W, 1, HK, 1]``);
- MLA layers are marked by ``head_count_kv = 1`` (the MQA form of the latent cache), KDA layers by 0;
  ``key_length`` / ``value_length`` are the latent cache's row (``kv_lora_rank + rope`` / ``kv_lora_rank``),
  as llama.cpp's DeepSeek-2 converter writes them (without ``value_length`` llama.cpp sizes the V cache
  as ``d_model / heads``).

llama.cpp's ``kimi-linear`` graph (``src/models/kimi-linear.cpp``) projects MLA queries with one
``attn_q`` matrix only: its loader reads ``attn_q_a``/``attn_q_b`` but the graph never uses them, so a
model with a low-rank query (``mla_q_lora_rank > 0``) is refused (Kimi-Linear itself has none).

Small tensors (norms, biases, ``ssm_a``, conv weights, the router) stay f32 in every ``outtype``; ``q8_0``
quantizes a matrix whose rows are a multiple of 32 long and writes the others f16.

The tokenizer (``tokenizer.json``, longmoe's byte-level BPE with one token per digit) is written as a
``gpt2`` vocabulary with pre-tokenizer ``smollm``, whose two regexes (``\\p{N}``, then GPT-2's) split
text as longmoe's ``Digits(individual_digits) + ByteLevel`` pre-tokenizer does (docs/interop.md).

The output is written to a temporary file next to ``out`` and renamed over it once complete, so a
failed export leaves an existing ``out`` untouched. The converted tensors are held in memory until the
file is written (the model's size in the output type).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors import safe_open

from longmoe.config import ModelConfig
from longmoe.data.tokenizer import TOKENIZER_FILE, Tokenizer
from longmoe.interop.kimi_config import HF_ARCHITECTURE, ConversionError, config_to_hf
from longmoe.interop.kimi_map import Piece, target_map
from longmoe.model import CONFIG_FILE, WEIGHTS_FILE

GGUF_ARCH = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.KIMI_LINEAR]  # "kimi-linear"
OUTTYPES = ("f32", "f16", "q8_0")
TOKENIZER_PRE = "smollm"  # llama.cpp: "\p{N}" then the GPT-2 regex, no space clean-up on decode
_FILE_TYPE = {
    "f32": gguf.LlamaFileType.ALL_F32,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
_T = gguf.MODEL_TENSOR
# transformers name (after "model.layers.{i}.") -> llama.cpp tensor and suffix
_LAYER_NAMES: dict[str, tuple[gguf.MODEL_TENSOR, str]] = {
    "input_layernorm.weight": (_T.ATTN_NORM, "weight"),
    "post_attention_layernorm.weight": (_T.FFN_NORM, "weight"),
    "self_attn.q_proj.weight": (_T.ATTN_Q, "weight"),
    "self_attn.k_proj.weight": (_T.ATTN_K, "weight"),
    "self_attn.v_proj.weight": (_T.ATTN_V, "weight"),
    "self_attn.o_proj.weight": (_T.ATTN_OUT, "weight"),
    "self_attn.b_proj.weight": (_T.SSM_BETA, "weight"),
    "self_attn.f_a_proj.weight": (_T.SSM_F_A, "weight"),
    "self_attn.f_b_proj.weight": (_T.SSM_F_B, "weight"),
    "self_attn.g_a_proj.weight": (_T.SSM_G_A, "weight"),
    "self_attn.g_b_proj.weight": (_T.SSM_G_B, "weight"),
    "self_attn.q_conv1d.weight": (_T.SSM_CONV1D_Q, "weight"),
    "self_attn.k_conv1d.weight": (_T.SSM_CONV1D_K, "weight"),
    "self_attn.v_conv1d.weight": (_T.SSM_CONV1D_V, "weight"),
    "self_attn.dt_bias": (_T.SSM_DT, "bias"),
    "self_attn.A_log": (_T.SSM_A, ""),
    "self_attn.o_norm.weight": (_T.SSM_NORM, "weight"),
    "self_attn.kv_a_proj_with_mqa.weight": (_T.ATTN_KV_A_MQA, "weight"),
    "self_attn.kv_a_layernorm.weight": (_T.ATTN_KV_A_NORM, "weight"),
    "block_sparse_moe.gate.weight": (_T.FFN_GATE_INP, "weight"),
    "block_sparse_moe.gate.e_score_correction_bias": (_T.FFN_EXP_PROBS_B, "bias"),
    "block_sparse_moe.shared_experts.gate_proj.weight": (_T.FFN_GATE_SHEXP, "weight"),
    "block_sparse_moe.shared_experts.up_proj.weight": (_T.FFN_UP_SHEXP, "weight"),
    "block_sparse_moe.shared_experts.down_proj.weight": (_T.FFN_DOWN_SHEXP, "weight"),
    "block_sparse_moe.gate_proj.weight": (_T.FFN_GATE, "weight"),  # the leading dense layers' MLP
    "block_sparse_moe.up_proj.weight": (_T.FFN_UP, "weight"),
    "block_sparse_moe.down_proj.weight": (_T.FFN_DOWN, "weight"),
}
_EXPERTS = {"w1": _T.FFN_GATE_EXP, "w3": _T.FFN_UP_EXP, "w2": _T.FFN_DOWN_EXP}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": _T.TOKEN_EMBD,
    "model.norm.weight": _T.OUTPUT_NORM,
    "lm_head.weight": _T.OUTPUT,
}
_ALWAYS_F32 = (_T.SSM_A, _T.SSM_CONV1D_Q, _T.SSM_CONV1D_K, _T.SSM_CONV1D_V, _T.FFN_GATE_INP)
_F32_BASES = {gguf.TENSOR_NAMES[k].rsplit(".", 1)[-1] for k in _ALWAYS_F32}  # "ssm_a", "ffn_gate_inp", ...
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT_RE = re.compile(r"block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight")


def tensor_name(kind: gguf.MODEL_TENSOR, layer: int | None = None, suffix: str = "weight") -> str:
    """llama.cpp's name of ``kind`` (``blk.3.ffn_gate_exps.weight``)."""
    base = gguf.TENSOR_NAMES[kind].format(bid=layer)
    return f"{base}.{suffix}" if suffix else base


def check_exportable(cfg: ModelConfig) -> None:
    """``ConversionError`` naming the first option llama.cpp's ``kimi-linear`` cannot run."""
    try:
        config_to_hf(cfg.replace(tie_embeddings=False))
    except ConversionError as e:  # the same limits as --to-hf, said for GGUF
        raise ConversionError(str(e).replace(HF_ARCHITECTURE, f"GGUF {GGUF_ARCH}")) from None
    if cfg.kda_heads != cfg.mla_heads:
        raise ConversionError(
            f"cannot export to GGUF {GGUF_ARCH}: kda_heads = {cfg.kda_heads}, expected mla_heads = "
            f"{cfg.mla_heads} (llama.cpp's kimi-linear has one head count for KDA and MLA layers)"
        )
    if cfg.mla_q_lora_rank:
        raise ConversionError(
            f"cannot export to GGUF {GGUF_ARCH}: mla_q_lora_rank = {cfg.mla_q_lora_rank}, expected 0 "
            "(llama.cpp's kimi-linear graph projects MLA queries with one attn_q matrix)"
        )
    if cfg.ffn.glu != "swiglu":
        raise ConversionError(
            f"cannot export to GGUF {GGUF_ARCH}: ffn.glu = {cfg.ffn.glu!r}, expected 'swiglu' "
            "(llama.cpp's kimi-linear runs SiLU-gated MLPs only)"
        )


def _gguf_pieces(hf_name: str, t: torch.Tensor, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The llama.cpp tensor(s) of one transformers tensor (experts are stacked by the caller)."""
    if hf_name in _GLOBAL_NAMES:
        yield tensor_name(_GLOBAL_NAMES[hf_name]), t
        return
    m = _LAYER_RE.fullmatch(hf_name)
    if m is None:
        raise ConversionError(f"no GGUF name for {hf_name}")
    i, rest = int(m.group(1)), m.group(2)
    if rest == "self_attn.kv_b_proj.weight":  # per head [k_h (nope) | v_h] rows -> k_b (transposed), v_b
        H, Dq, Dv = cfg.mla_heads, cfg.mla_head_dim, cfg.mla_v_head_dim
        kv = t.reshape(H, Dq + Dv, -1)
        yield tensor_name(_T.ATTN_K_B, i), kv[:, :Dq].transpose(1, 2)  # [H, kv_lora_rank, nope]
        yield tensor_name(_T.ATTN_V_B, i), kv[:, Dq:]  # [H, v_head_dim, kv_lora_rank]
        return
    kind, suffix = _LAYER_NAMES[rest]
    if kind == _T.SSM_A:
        t = -torch.exp(t.float())
    elif kind in (_T.SSM_CONV1D_Q, _T.SSM_CONV1D_K, _T.SSM_CONV1D_V):
        t = t.reshape(1, t.shape[0], 1, t.shape[-1])  # ggml ne [W, 1, HK, 1]
    yield tensor_name(kind, i, suffix), t


def gguf_tensors(src: Path, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Every llama.cpp tensor of the longmoe model in ``src``, read one longmoe tensor at a time."""
    tmap = target_map(cfg)
    if cfg.tie_embeddings:  # llama.cpp's kimi-linear needs an explicit output matrix
        head = ("lm_head.weight", Piece("embed.weight"), (cfg.vocab_size, cfg.d_model))
        tmap["embed.weight"] = [*tmap["embed.weight"], head]
    with safe_open(str(src / WEIGHTS_FILE), framework="pt") as fh:
        names = list(fh.keys())
    for name in names:
        if name not in tmap:
            continue  # balancer state (load windows, counters): not part of the forward
        with safe_open(str(src / WEIGHTS_FILE), framework="pt") as fh:
            t = fh.get_tensor(name).float()
        experts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
        for hf_name, piece, shape in tmap[name]:
            hf = piece.read(t, shape)
            m = _LAYER_RE.fullmatch(hf_name)
            e = _EXPERT_RE.fullmatch(m.group(2)) if m else None
            if e is not None:
                experts.setdefault((int(m.group(1)), e.group(2)), {})[int(e.group(1))] = hf
                continue
            yield from _gguf_pieces(hf_name, hf, cfg)
        for (i, part), per_expert in sorted(experts.items()):
            stacked = torch.stack([per_expert[j] for j in range(len(per_expert))])  # [E, out, in]
            yield tensor_name(_EXPERTS[part], i), stacked


def _encode(name: str, t: torch.Tensor, outtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """The array to store and its ggml type: f32 for vectors and the tensors llama.cpp reads as f32."""
    a = t.detach().float().contiguous().numpy()
    keep_f32 = a.ndim == 1 or (name.startswith("blk.") and name.split(".")[2] in _F32_BASES)
    if outtype == "f32" or keep_f32:
        return a, gguf.GGMLQuantizationType.F32
    if outtype == "q8_0" and a.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0] == 0:
        return gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return a.astype(np.float16), gguf.GGMLQuantizationType.F16


def _add_metadata(w: gguf.GGUFWriter, cfg: ModelConfig, name: str, outtype: str) -> None:
    f = cfg.ffn
    n_dense = f.first_k_dense if f.kind == "moe" else cfg.n_layers
    rope = cfg.mla_shared_key_dim  # the un-rotated shared key part: llama.cpp's "rope" dims, never rotated
    w.add_name(name)
    w.add_file_type(_FILE_TYPE[outtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_seq_len)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(f.dense_hidden)
    w.add_head_count(cfg.mla_heads)
    w.add_head_count_kv([1 if k == "M" else 0 for k in cfg.layer_types])  # 0 marks a recurrent KDA layer
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_ssm_conv_kernel(cfg.kda_conv_size)
    w.add_kda_head_dim(cfg.kda_head_dim)
    w.add_kv_lora_rank(cfg.mla_kv_lora_rank)
    w.add_rope_dimension_count(rope)
    w.add_key_length(cfg.mla_kv_lora_rank + rope)  # the MQA form: one latent "head" per token
    w.add_value_length(cfg.mla_kv_lora_rank)
    w.add_key_length_mla(cfg.mla_head_dim + rope)
    w.add_value_length_mla(cfg.mla_v_head_dim)
    w.add_expert_count(f.n_experts)
    w.add_expert_used_count(f.top_k)
    w.add_expert_group_count(f.n_group)
    w.add_expert_group_used_count(f.topk_group)
    w.add_expert_feed_forward_length(f.expert_hidden)
    w.add_expert_shared_count(f.n_shared)
    w.add_leading_dense_block_count(n_dense)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_norm(True)
    w.add_expert_weights_scale(f.routed_scale)


def _add_tokenizer(w: gguf.GGUFWriter, src: Path, cfg: ModelConfig) -> None:
    path = src / TOKENIZER_FILE
    if not path.is_file():
        raise ConversionError(
            f"{src} has no {TOKENIZER_FILE}: a GGUF file needs the vocabulary (add the longmoe tokenizer)"
        )
    tok = Tokenizer.from_file(path)
    spec = json.loads(path.read_text())
    model, pre = spec.get("model") or {}, json.dumps(spec.get("pre_tokenizer"))
    if model.get("type") != "BPE" or '"Digits"' not in pre or '"ByteLevel"' not in pre:
        raise ConversionError(
            f"{path}: expected longmoe's byte-level BPE with one token per digit (pre-tokenizer "
            f"{TOKENIZER_PRE!r}); got model {model.get('type')!r}, pre-tokenizer {pre}"
        )
    by_id = {i: s for s, i in model["vocab"].items()}
    added = spec.get("added_tokens", [])
    special = {a["id"]: a["content"] for a in added if a.get("special", True)}
    by_id.update({a["id"]: a["content"] for a in added})
    if max(by_id) >= cfg.vocab_size:
        raise ConversionError(
            f"{path}: token id {max(by_id)} does not fit the model's vocab_size {cfg.vocab_size}"
        )
    tokens, types = [], []
    for i in range(cfg.vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        else:  # the embedding is padded past the tokenizer: ids no text produces
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(TOKENIZER_PRE)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.bos_id)
    w.add_eos_token_id(tok.eos_id)
    w.add_pad_token_id(tok.pad_id)
    w.add_add_bos_token(True)  # longmoe scores documents as <|bos|> + text
    w.add_add_eos_token(False)


def to_gguf(src: str | Path, out: str | Path, outtype: str = "f32") -> ModelConfig:
    """Write the longmoe model directory ``src`` as the GGUF file ``out`` (``outtype``: f32, f16, q8_0).

    Raises ``ConversionError`` naming the option llama.cpp's ``kimi-linear`` lacks, before writing.
    """
    if outtype not in OUTTYPES:
        raise ConversionError(f"outtype {outtype!r}: expected one of {OUTTYPES}")
    src, out = Path(src), Path(out)
    cfg = ModelConfig.load(src / CONFIG_FILE)
    check_exportable(cfg)
    if out.is_dir():
        raise ConversionError(f"--out {out} is a directory; expected a .gguf file path")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), GGUF_ARCH)
    try:
        _add_metadata(writer, cfg, src.resolve().name, outtype)
        _add_tokenizer(writer, src, cfg)
        for name, t in gguf_tensors(src, cfg):
            data, qtype = _encode(name, t, outtype)
            writer.add_tensor(name, data, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(Exception):
            writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return cfg


__all__ = ["GGUF_ARCH", "OUTTYPES", "check_exportable", "gguf_tensors", "to_gguf"]
