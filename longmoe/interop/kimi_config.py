"""Kimi-Linear ``config.json`` (transformers ``KimiLinearConfig``, or Moonshot's own) <-> ``ModelConfig``.

What corresponds (see docs/interop.md for the table):

- layers: ``linear_attn_config.kda_layers`` / ``full_attn_layers`` (1-indexed) -> ``layer_pattern``,
  one letter per layer ("L" KDA, "M" MLA); ``mlp_layer_types`` / ``first_k_dense_replace`` ->
  ``ffn.first_k_dense``;
- KDA: Kimi's gate ``-exp(A_log)·softplus(f + dt_bias)`` -> ``kda_gate="kimi"``; the low-rank forget gate
  (``f_a_proj`` to ``head_dim``) -> ``kda_gate_rank``; the low-rank output gate (``g_a_proj``) ->
  ``kda_out_gate_rank``; FLA's ``x/sqrt(|x|² + 1e-6)`` q/k norm -> ``kda_l2_eps``;
- MLA: NoPE (``mla_use_nope: true``; transformers never rotates), so the "rotary" key part
  ``qk_rope_head_dim`` is a plain key part shared by all heads -> ``mla_shared_key_dim``; no output gate
  (``mla_gate=False``), latent norms with eps 1e-6 (``mla_norm_eps``), ``q_lora_rank: null`` ->
  ``mla_q_lora_rank = 0``;
- MoE: sigmoid router, ``e_score_correction_bias`` -> the balancing bias, grouped top-k, full-width experts
  (latent α = 1), ``routed_scaling_factor`` -> ``ffn.routed_scale``; plain pre-norm residuals.

Anything longmoe cannot express exactly is a ``ConversionError`` naming the field.
"""

from __future__ import annotations

from typing import Any

from longmoe.config import FFNConfig, ModelConfig

HF_ARCHITECTURE = "KimiLinearForCausalLM"
HF_MODEL_TYPE = "kimi_linear"
FLA_L2_EPS = 1e-6  # the eps inside transformers' / FLA's q/k l2norm
HF_LATENT_NORM_EPS = 1e-6  # KimiLinearRMSNorm's default, used by q_a_layernorm / kv_a_layernorm
_ACT_TO_GLU = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu"}
_GLU_TO_ACT = {"swiglu": "silu", "geglu": "gelu"}


class ConversionError(ValueError):
    """A checkpoint or configuration feature has no exact counterpart on the other side."""


def _get(hf: dict[str, Any], *names: str, default: Any = None) -> Any:
    """The first of ``names`` present in ``hf`` (transformers saves some fields under aliases)."""
    for n in names:
        if n in hf and hf[n] is not None:
            return hf[n]
    return default


def _which(hf: dict[str, Any], *names: str) -> str:
    """The first of ``names`` present in ``hf`` (for error messages), else the first one."""
    return next((n for n in names if n in hf), names[0])


def hf_layer_types(hf: dict[str, Any]) -> list[str]:
    """``"linear_attention"`` / ``"full_attention"`` per layer, as transformers derives them."""
    n = int(hf["num_hidden_layers"])
    lac = hf.get("linear_attn_config") or {}
    if "kda_layers" in lac and "full_attn_layers" in lac:
        types: list[str | None] = [None] * n
        for i in lac["full_attn_layers"]:
            types[int(i) - 1] = "full_attention"  # 1-indexed in the checkpoint
        for i in lac["kda_layers"]:
            types[int(i) - 1] = "linear_attention"
        if None in types:
            raise ConversionError(
                f"linear_attn_config: layers {[i + 1 for i, t in enumerate(types) if t is None]} are in "
                "neither kda_layers nor full_attn_layers"
            )
        return types  # type: ignore[return-value]
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    return ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]


def _first_k_dense(hf: dict[str, Any], n: int) -> int:
    mlp = hf.get("mlp_layer_types")
    if not mlp:
        return min(n, int(_get(hf, "first_k_dense_replace", default=1)))
    k = sum(1 for t in mlp if t == "dense")
    if list(mlp) != ["dense"] * k + ["sparse"] * (n - k):
        raise ConversionError(f"mlp_layer_types = {mlp}: longmoe needs dense layers first, then sparse ones")
    return k


def config_from_hf(hf: dict[str, Any], dtype: str | None = None) -> ModelConfig:
    """The ``ModelConfig`` computing what ``KimiLinearForCausalLM(hf)`` computes."""
    arch = hf.get("architectures") or [HF_ARCHITECTURE]
    if hf.get("model_type", HF_MODEL_TYPE) != HF_MODEL_TYPE or HF_ARCHITECTURE not in arch:
        raise ConversionError(
            f"config.json: expected model_type {HF_MODEL_TYPE!r} / {HF_ARCHITECTURE}, got "
            f"{hf.get('model_type')!r} / {arch}"
        )
    n = int(hf["num_hidden_layers"])
    heads = int(hf["num_attention_heads"])
    use_nope = bool(_get(hf, "mla_use_nope", default=True))  # transformers' model never rotates
    checks = [
        (
            use_nope or int(_get(hf, "qk_rope_head_dim", default=0)) == 0,
            "qk_rope_head_dim",
            "0 unless mla_use_nope is true: longmoe's MLA has no positional encoding, so a rotated key "
            "part cannot be expressed (with mla_use_nope it is the un-rotated shared key part)",
        ),
        (
            int(_get(hf, "num_key_value_heads", default=heads)) == heads,
            "num_key_value_heads",
            f"equal to num_attention_heads = {heads}",
        ),
        (not hf.get("attention_bias", False), "attention_bias", "false"),
        (
            bool(_get(hf, "moe_renormalize", "norm_topk_prob", default=True)),
            _which(hf, "moe_renormalize", "norm_topk_prob"),
            "true (longmoe renormalises the selected scores)",
        ),
        (
            _get(hf, "moe_router_activation_func", default="sigmoid") == "sigmoid",
            "moe_router_activation_func",
            "'sigmoid'",
        ),
        (int(_get(hf, "moe_layer_freq", default=1)) == 1, "moe_layer_freq", "1"),
        (use_nope, "mla_use_nope", "true (NoPE MLA)"),
        (hf.get("hidden_act", "silu") in _ACT_TO_GLU, "hidden_act", f"one of {sorted(_ACT_TO_GLU)}"),
    ]
    for ok, field, expected in checks:
        if not ok:
            raise ConversionError(
                f"config.json field {field!r} = {hf.get(field)!r} is not supported: expected {expected}"
            )
    types = hf_layer_types(hf)
    k_dense = _first_k_dense(hf, n)
    lac = hf.get("linear_attn_config") or {}
    kda_dim = int(lac.get("head_dim", _get(hf, "linear_head_dim", default=128)))
    n_experts = int(_get(hf, "num_experts", "num_local_experts", default=256))
    n_shared = int(_get(hf, "num_shared_experts", "n_shared_experts", default=1))
    moe_hidden = int(_get(hf, "moe_intermediate_size", default=1024))
    grouped = bool(_get(hf, "use_grouped_topk", default=True))
    n_group = int(_get(hf, "num_expert_group", "n_group", default=1)) if grouped else 1
    src_dtype = str(_get(hf, "dtype", "torch_dtype", default="float32"))
    ffn = FFNConfig(
        kind="moe" if k_dense < n else "dense",
        dense_hidden=int(_get(hf, "intermediate_size", default=9216)),
        glu=_ACT_TO_GLU[hf.get("hidden_act", "silu")],
        n_experts=n_experts,
        top_k=int(_get(hf, "num_experts_per_token", "num_experts_per_tok", default=8)),
        n_shared=n_shared,
        latent_ratio=1,
        expert_hidden=moe_hidden,
        shared_hidden=moe_hidden,
        first_k_dense=k_dense,
        routed_scale=float(_get(hf, "routed_scaling_factor", default=1.0)),
        balancer="sign",  # the aux-loss-free rule e_score_correction_bias was trained with
        n_group=n_group,
        topk_group=int(_get(hf, "topk_group", default=1)) if grouped else 1,
    )
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        d_model=int(hf["hidden_size"]),
        n_layers=n,
        layer_pattern="".join("M" if t == "full_attention" else "L" for t in types),
        max_seq_len=int(_get(hf, "model_max_length", "max_position_embeddings", default=1 << 20)),
        kda_heads=int(lac.get("num_heads", _get(hf, "linear_num_heads", default=32))),
        kda_head_dim=kda_dim,
        kda_conv_size=int(lac.get("short_conv_kernel_size", _get(hf, "linear_conv_kernel_dim", default=4))),
        kda_gate_rank=kda_dim,
        kda_gate="kimi",
        kda_out_gate_rank=kda_dim,
        kda_l2_eps=FLA_L2_EPS,
        mla_heads=heads,
        mla_q_lora_rank=int(_get(hf, "q_lora_rank", default=0)),
        mla_kv_lora_rank=int(_get(hf, "kv_lora_rank", default=512)),
        mla_head_dim=int(_get(hf, "qk_nope_head_dim", default=128)),
        mla_shared_key_dim=int(_get(hf, "qk_rope_head_dim", default=0)),
        mla_v_head_dim=int(_get(hf, "v_head_dim", default=128)),
        mla_gate=False,
        mla_norm_eps=HF_LATENT_NORM_EPS,
        attn_res=False,
        attn_res_blocks=1,
        norm_eps=float(_get(hf, "rms_norm_eps", default=1e-5)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        init_std=float(_get(hf, "initializer_range", default=0.02)),
        dtype=dtype or ("bfloat16" if src_dtype == "bfloat16" else "float32"),
        ffn=ffn,
    )


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """The transformers ``config.json`` of ``cfg``; ``ConversionError`` names what Kimi-Linear lacks."""
    f = cfg.ffn
    mla_eps = cfg.norm_eps if cfg.mla_norm_eps is None else cfg.mla_norm_eps
    checks = [
        (cfg.kda_gate == "kimi", "kda_gate", f"'kimi' (Kimi-Linear has no {cfg.kda_gate!r} decay gate)"),
        (not cfg.attn_res, "attn_res", "false (Kimi-Linear has no block attention residuals)"),
        (
            f.latent_ratio == 1,
            "ffn.latent_ratio",
            "1 (Kimi-Linear's experts run at full width, no latent space)",
        ),
        (not cfg.mla_gate, "mla_gate", "false (Kimi-Linear's MLA has no output gate)"),
        (cfg.mla_logn_scale == 0, "mla_logn_scale", "0 (Kimi-Linear's MLA has no log-length scaling)"),
        (cfg.kda_gate_rank == cfg.kda_head_dim, "kda_gate_rank", f"kda_head_dim = {cfg.kda_head_dim}"),
        (
            cfg.kda_out_gate_rank == cfg.kda_head_dim,
            "kda_out_gate_rank",
            f"kda_head_dim = {cfg.kda_head_dim}",
        ),
        (cfg.kda_l2_eps == FLA_L2_EPS, "kda_l2_eps", f"{FLA_L2_EPS} (transformers' q/k l2norm)"),
        (
            mla_eps == HF_LATENT_NORM_EPS,
            "mla_norm_eps",
            f"{HF_LATENT_NORM_EPS} (KimiLinearRMSNorm's default)",
        ),
        (
            f.kind == "dense" or f.n_shared == 0 or f.shared_hidden == f.expert_hidden,
            "ffn.shared_hidden",
            f"ffn.expert_hidden = {f.expert_hidden} (Kimi-Linear's shared experts are expert-sized)",
        ),
    ]
    for ok, field, expected in checks:
        if not ok:
            raise ConversionError(
                f"cannot export to {HF_ARCHITECTURE}: {field} = {getattr_path(cfg, field)!r}, "
                f"expected {expected}"
            )
    types = cfg.layer_types
    n_dense = f.first_k_dense if f.kind == "moe" else cfg.n_layers
    return {
        "architectures": [HF_ARCHITECTURE],
        "model_type": HF_MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": f.dense_hidden,
        "moe_intermediate_size": f.expert_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.mla_heads,
        "num_key_value_heads": cfg.mla_heads,
        "num_shared_experts": f.n_shared,
        "routed_scaling_factor": f.routed_scale,
        "kv_lora_rank": cfg.mla_kv_lora_rank,
        "q_lora_rank": cfg.mla_q_lora_rank or None,
        "qk_rope_head_dim": cfg.mla_shared_key_dim,
        "mla_use_nope": True,  # Moonshot's code rotates the shared key part without it
        "qk_nope_head_dim": cfg.mla_head_dim,
        "v_head_dim": cfg.mla_v_head_dim,
        "num_expert_group": f.n_group,
        "topk_group": f.topk_group,
        "num_experts_per_token": f.top_k,
        "num_experts": f.n_experts,
        "moe_renormalize": True,
        "hidden_act": _GLU_TO_ACT[f.glu],
        "model_max_length": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "first_k_dense_replace": n_dense,
        "mlp_layer_types": ["dense" if i < n_dense else "sparse" for i in range(cfg.n_layers)],
        "linear_attn_config": {
            "kda_layers": [i + 1 for i, t in enumerate(types) if t == "L"],
            "full_attn_layers": [i + 1 for i, t in enumerate(types) if t == "M"],
            "head_dim": cfg.kda_head_dim,
            "num_heads": cfg.kda_heads,
            "short_conv_kernel_size": cfg.kda_conv_size,
        },
        "dtype": cfg.dtype,
        "pad_token_id": None,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def getattr_path(cfg: ModelConfig, field: str) -> Any:
    """``cfg.ffn.latent_ratio`` for ``"ffn.latent_ratio"``."""
    obj: Any = cfg
    for part in field.split("."):
        obj = getattr(obj, part)
    return obj
