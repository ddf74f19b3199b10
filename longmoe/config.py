"""Typed, validated model configuration (``config.json``): ``ModelConfig`` and its ``FFNConfig`` and
``VisionConfig`` sections.

Every field is checked on construction; errors name the field and the allowed values so a user
editing ``config.json`` by hand knows exactly what to fix. The file I/O is ``longmoe.configio``'s,
the checks ``longmoe.validation``'s, the named presets ``longmoe.presets``'.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from longmoe.configio import JsonConfig, check_types, dataclass_from_dict
from longmoe.validation import ConfigError as ConfigError  # the model config's error, importable from here
from longmoe.validation import check, check_positive, is_positive_int

# Label of a position that is not a training target (document boundaries, masked prompts): the
# ``ignore_index`` of the model's cross-entropy and what the data packer writes.
IGNORE_INDEX = -100

LAYER_KINDS = {"L": "KDA linear attention", "M": "gated NoPE MLA"}
FFN_KINDS = ("dense", "moe")
GLU_KINDS = ("swiglu", "geglu")
BALANCERS = ("quantile", "sign", "aux", "none")
DECAY_GATES = ("bounded", "softplus", "kimi")
DTYPES = ("float32", "bfloat16")
VISION_ENCODERS = ("linear", "vit", "conv")
# id of ``<|image_patch|>`` in every longmoe tokenizer (its special tokens have fixed ids 0..11; see
# data/tokenizer.py, whose tests check this): the model finds the positions it writes image
# embeddings into by this id, without importing the data layer
IMAGE_PATCH_TOKEN_ID = 11


@dataclass
class FFNConfig:
    """The feed-forward section: dense SwiGLU everywhere, or sparse MoE with a latent expert space.

    With ``kind="moe"`` the first ``first_k_dense`` layers stay dense (``dense_hidden``); the rest
    route each token to ``top_k`` of ``n_experts`` GLU experts that run in ``latent_dim = d_model /
    latent_ratio`` (α = ``latent_ratio``; 1 disables the latent space), plus ``n_shared`` full-width
    shared experts of width ``shared_hidden``.
    """

    kind: str = "dense"
    dense_hidden: int = 512  # hidden width of dense SwiGLU MLPs
    glu: str = "swiglu"
    n_experts: int = 8
    top_k: int = 2
    n_shared: int = 1
    latent_ratio: int = 1  # α = d_model / ℓ
    expert_hidden: int = 128  # f: routed expert GLU width (in latent space)
    shared_hidden: int = 128  # shared expert GLU width (full width)
    first_k_dense: int = 0
    routed_scale: float = 1.0
    # grouped top-k (DeepSeek-V3 / Kimi): experts in n_group equal groups, a token picks its topk_group
    # best groups (by the sum of each group's two best biased scores) and its top_k experts inside them
    n_group: int = 1
    topk_group: int = 1
    balancer: str = "quantile"
    bias_step: float = 1e-3  # δ: bias step of the loss-free balancers
    balance_quantile: float = 0.5
    balance_window: int = 8  # optimizer steps in the running-load window
    aux_loss_coef: float = 1e-2

    def validate(self, d_model: int | None = None) -> None:
        check_types(self, "ffn.")
        check(self.kind in FFN_KINDS, "ffn.kind", self.kind, f"one of {FFN_KINDS}")
        check(self.glu in GLU_KINDS, "ffn.glu", self.glu, f"one of {GLU_KINDS}")
        check(self.balancer in BALANCERS, "ffn.balancer", self.balancer, f"one of {BALANCERS}")
        check_positive(
            self, "dense_hidden", "n_experts", "top_k", "latent_ratio", "expert_hidden", "balance_window"
        )
        check(
            self.top_k <= self.n_experts,
            "ffn.top_k",
            self.top_k,
            f"an integer in [1, n_experts={self.n_experts}]",
        )
        for n in ("n_shared", "first_k_dense"):
            v = getattr(self, n)
            check(isinstance(v, int) and v >= 0, f"ffn.{n}", v, "a non-negative integer")
        if self.n_shared:
            check_positive(self, "shared_hidden")
        check(
            0.0 < self.balance_quantile < 1.0,
            "ffn.balance_quantile",
            self.balance_quantile,
            "a float in (0, 1)",
        )
        check(self.bias_step >= 0.0, "ffn.bias_step", self.bias_step, "a float >= 0")
        check(self.aux_loss_coef >= 0.0, "ffn.aux_loss_coef", self.aux_loss_coef, "a float >= 0")
        check(self.routed_scale > 0.0, "ffn.routed_scale", self.routed_scale, "a float > 0")
        check_positive(self, "n_group", "topk_group")
        check(
            self.n_experts % self.n_group == 0,
            "ffn.n_group",
            self.n_group,
            f"a divisor of n_experts={self.n_experts}",
        )
        check(
            self.topk_group <= self.n_group,
            "ffn.topk_group",
            self.topk_group,
            f"an integer in [1, n_group={self.n_group}]",
        )
        reach = self.topk_group * (self.n_experts // self.n_group)  # experts in the kept groups
        check(
            self.top_k <= reach,
            "ffn.top_k",
            self.top_k,
            f"at most topk_group * n_experts / n_group = {reach}",
        )
        if d_model is not None:
            check(
                d_model % self.latent_ratio == 0,
                "ffn.latent_ratio",
                self.latent_ratio,
                f"a divisor of d_model={d_model}",
            )

    def latent_dim(self, d_model: int) -> int:
        return d_model // self.latent_ratio


@dataclass
class VisionConfig:
    """Native image input: an image becomes ``rows × cols`` patches of ``patch_size²`` pixels whose
    embeddings take the places of ``<|image_patch|>`` tokens in the token stream (docs/model.md,
    "Vision input").

    The longer image side is scaled down to at most ``max_image_side`` pixels (aspect kept), then
    both sides are rounded to a multiple of ``patch_size`` (at least one patch), so an image costs at
    most ``(max_image_side / patch_size)²`` patch tokens plus its two markers. ``encoder``: "linear"
    (one projection of a patch's pixels to ``d_model``), "vit" (a bidirectional pre-norm
    transformer of ``depth`` layers, ``width`` wide with ``heads`` heads, over the patches of one
    image, then a projection to ``d_model``) or "conv" (``depth`` 3×3 convolutions of
    ``stem_channels`` at full resolution, then a stride-``patch_size`` convolution whose window is
    the patch and half a patch around it, ``width`` channels, a residual GLU MLP, a projection to
    ``d_model``: a patch's feature sees a glyph whole wherever it sits). ``width``, ``depth`` and
    ``mlp_ratio`` are used by "vit" and "conv", ``heads`` by "vit", ``stem_channels`` by "conv".
    """

    patch_size: int = 8
    max_image_side: int = 256
    encoder: str = "linear"
    width: int = 256
    depth: int = 2
    heads: int = 4
    mlp_ratio: int = 4  # ViT / conv MLP hidden = mlp_ratio * width
    stem_channels: int = 16  # conv: channels of the full-resolution 3x3 convolutions

    def validate(self) -> None:
        check_types(self, "vision.")
        for n in ("patch_size", "max_image_side", "width", "depth", "heads", "mlp_ratio", "stem_channels"):
            v = getattr(self, n)
            check(is_positive_int(v), f"vision.{n}", v, "a positive integer")
        check(self.encoder in VISION_ENCODERS, "vision.encoder", self.encoder, f"one of {VISION_ENCODERS}")
        check(
            self.max_image_side % self.patch_size == 0,
            "vision.max_image_side",
            self.max_image_side,
            f"a multiple of patch_size={self.patch_size}",
        )
        check(self.width % self.heads == 0, "vision.width", self.width, f"a multiple of heads={self.heads}")

    @property
    def max_grid(self) -> int:
        """Most patches along one side of an image (rows or cols)."""
        return self.max_image_side // self.patch_size

    @property
    def patch_dim(self) -> int:
        """Numbers per patch: 3 colour channels × patch_size²."""
        return 3 * self.patch_size * self.patch_size

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """``(height, width)`` of an image after the resize rule: the longer side scaled down to at most
        ``max_image_side`` (never enlarged), each side rounded to the nearest multiple of ``patch_size``
        (at least one patch)."""
        if not (is_positive_int(height) and is_positive_int(width)):
            raise ValueError(f"image size {height!r}×{width!r} is invalid: expected positive integer sides")
        p, scale = self.patch_size, min(1.0, self.max_image_side / max(height, width))
        return max(p, round(height * scale / p) * p), max(p, round(width * scale / p) * p)

    def image_tokens(self, height: int, width: int) -> int:
        """Tokens an image of ``height × width`` pixels takes in the stream, its two markers included."""
        h, w = self.resized_size(height, width)
        return (h // self.patch_size) * (w // self.patch_size) + 2


@dataclass
class ModelConfig(JsonConfig):
    """The hybrid stack: KDA ("L") and gated MLA ("M") layers per ``layer_pattern``, no positions."""

    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 8
    layer_pattern: str = "LLLM"  # repeated to n_layers
    max_seq_len: int = 4096  # context window the model is trained/served for (no positional limit)
    # KDA (incremental linear attention)
    kda_heads: int = 4
    kda_head_dim: int = 64  # K = V per head
    kda_conv_size: int = 4
    kda_gate_rank: int = 32  # low-rank decay-gate projection d -> r -> H*K
    kda_gate: str = "bounded"  # "softplus": unbounded baseline (ablation); "kimi": Kimi-Linear's gate
    g_min: float = -5.0
    kda_chunk_size: int = 16
    kda_out_gate_rank: int = 0  # output gate W_g: 0 = full rank d -> H*V; r > 0 = d -> r -> H*V
    kda_l2_eps: float | None = None  # q/k L2 norm: None = x/max(|x|, 1e-12); eps = x/sqrt(|x|^2 + eps)
    # Gated MLA
    mla_heads: int = 4
    mla_q_lora_rank: int = 128  # 0 = a full-rank query projection (no q latent, no q norm)
    mla_kv_lora_rank: int = 64  # d_c: latent numbers cached per token per MLA layer
    mla_head_dim: int = 64  # q/k head dim of the part keyed from the latent (NoPE: no rotary part)
    mla_shared_key_dim: int = 0  # d_r: a key part shared by all heads, cached beside the latent (MQA-style,
    # Kimi-Linear's k_pe without rotation); q/k heads are then mla_head_dim + d_r wide; 0 = none
    mla_v_head_dim: int = 64
    mla_gate: bool = True  # sigmoid output gate on the head outputs; False = plain MLA (Kimi-Linear)
    mla_norm_eps: float | None = None  # eps of the q / kv latent norms; None = norm_eps
    # log-length attention scaling (scalable softmax, SSMax): a query that sees n keys has its logits
    # multiplied by mla_logn_scale · ln(n) (n = its position in its sequence + 1); 0.0 = off (plain softmax)
    mla_logn_scale: float = 0.0
    # residual stream
    attn_res: bool = True  # block attention residuals; False = plain residuals (ablation)
    attn_res_blocks: int = 4  # N blocks of layers
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    init_std: float = 0.02
    dtype: str = "float32"
    ffn: FFNConfig = field(default_factory=FFNConfig)
    vision: VisionConfig | None = None  # None: a text-only model

    def __post_init__(self) -> None:
        if isinstance(self.ffn, dict):
            self.ffn = dataclass_from_dict(FFNConfig, self.ffn, prefix="ffn.")
        if isinstance(self.vision, dict):
            self.vision = dataclass_from_dict(VisionConfig, self.vision, prefix="vision.")
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        check_types(self)
        check_positive(
            self,
            "vocab_size",
            "d_model",
            "n_layers",
            "max_seq_len",
            "kda_heads",
            "kda_head_dim",
            "kda_conv_size",
            "kda_gate_rank",
            "kda_chunk_size",
            "mla_heads",
            "mla_kv_lora_rank",
            "mla_head_dim",
            "mla_v_head_dim",
            "attn_res_blocks",
        )
        p = self.layer_pattern
        check(
            isinstance(p, str) and len(p) > 0 and set(p) <= set(LAYER_KINDS),
            "layer_pattern",
            p,
            "a non-empty string of 'L' (KDA linear attention) and 'M' (gated NoPE MLA)",
        )
        check(
            self.n_layers % len(p) == 0,
            "layer_pattern",
            p,
            f"a pattern whose length divides n_layers={self.n_layers}",
        )
        check(self.kda_gate in DECAY_GATES, "kda_gate", self.kda_gate, f"one of {DECAY_GATES}")
        check(self.g_min < 0.0, "g_min", self.g_min, "a negative float (e.g. -5.0)")
        for n in ("kda_out_gate_rank", "mla_q_lora_rank"):
            v = getattr(self, n)
            check(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                n,
                v,
                "a non-negative integer (0 = full rank)",
            )
        v = self.mla_shared_key_dim
        check(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "mla_shared_key_dim",
            v,
            "a non-negative integer (0 = no shared key part)",
        )
        for n in ("kda_l2_eps", "mla_norm_eps"):
            v = getattr(self, n)
            check(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0),
                n,
                v,
                "null or a float > 0",
            )
        check(isinstance(self.mla_gate, bool), "mla_gate", self.mla_gate, "true or false")
        v = self.mla_logn_scale
        check(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < float("inf"),
            "mla_logn_scale",
            v,
            "a finite float >= 0 (0 = off; s > 0: logits times s·ln(keys seen))",
        )
        check(
            self.attn_res_blocks <= self.n_layers,
            "attn_res_blocks",
            self.attn_res_blocks,
            f"an integer in [1, n_layers={self.n_layers}]",
        )
        check(self.norm_eps > 0, "norm_eps", self.norm_eps, "a float > 0")
        check(self.init_std > 0, "init_std", self.init_std, "a float > 0")
        check(self.dtype in DTYPES, "dtype", self.dtype, f"one of {DTYPES}")
        self.ffn.validate(self.d_model)
        if self.vision is not None:
            self.vision.validate()
        if self.ffn.kind == "moe":
            check(
                self.ffn.first_k_dense <= self.n_layers,
                "ffn.first_k_dense",
                self.ffn.first_k_dense,
                f"an integer in [0, n_layers={self.n_layers}]",
            )

    # ------------------------------------------------------------------ derived
    @property
    def layer_types(self) -> list[str]:
        """One letter per layer: the pattern repeated to ``n_layers``."""
        return list(self.layer_pattern * (self.n_layers // len(self.layer_pattern)))

    def is_moe_layer(self, i: int) -> bool:
        return self.ffn.kind == "moe" and i >= self.ffn.first_k_dense

    # ------------------------------------------------------------------ I/O
    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)
