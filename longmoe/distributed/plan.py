"""How a config maps onto a cluster of ``dp_shard · ep · cp`` devices, from the config alone.

``longmoe inspect --parallel dp_shard=A,ep=B,cp=C`` prints this; ``docs/distributed.md`` quotes it.
Given the parameter counts (``inspect.param_counts``) it reports, per device:

- **weights / gradients / optimizer**: FSDP2 shards every parameter over all devices (routed experts
  over ``ep`` first, then over the remaining ``dp_shard · cp``), so each holds 1/world of each; AdamW's
  two moments are kept in the parameters' dtype (as ``torch.optim.AdamW`` allocates them). FSDP also
  gathers one sublayer at a time: the largest such unit is reported as the gather buffer.
- **activations** for one window of ``seq_len`` tokens split over ``cp`` devices, with activation
  checkpointing: the saved input of every sublayer (``2 · n_layers · d`` numbers per token) plus the
  working set of one recomputed MoE sublayer (``top_k`` latent rows and expert hiddens per token) and
  the fp32 logits of the local tokens (unchunked cross-entropy). Dominant terms, not an allocator trace.
- **cache**: the inference cache for the window, with the MLA latents split over ``cp`` devices.
- **all-to-all**: bytes one token moves per MoE layer for expert parallelism, dispatch + combine (bf16
  rows of ``ℓ = d/α`` numbers for each of its ``top_k`` experts; the share ``(ep−1)/ep`` of them leaves
  the device under uniform routing), forward and forward+backward, for ``α`` = 1, the config's, and 4.
- **CP degree**: the smallest power-of-two ``cp`` at which a 1M-token window fits ``device_memory``
  with the other degrees as given.
"""

from __future__ import annotations

from typing import Any

from longmoe.config import ModelConfig
from longmoe.distributed.parallel_dims import ParallelDims

BF16_BYTES = 2
FP32_BYTES = 4
DTYPE_BYTES = {"float32": FP32_BYTES, "bfloat16": BF16_BYTES}
OPTIMIZER_COPIES = 2  # AdamW: exp_avg, exp_avg_sq
ONE_M = 1 << 20
MAX_CP = 1 << 12


def _unit_params(cfg: ModelConfig, counts: dict[str, int], dims: ParallelDims) -> int:
    """Parameters of the largest FSDP unit once gathered (a mixer, or an FFN with its experts / ep)."""
    n_l, n_m = cfg.layer_types.count("L"), cfg.layer_types.count("M")
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    mixers = [counts["kda"] // n_l if n_l else 0, counts["mla"] // n_m if n_m else 0]
    moe = 0
    if n_moe:
        moe_keys = ("router", "latent_proj", "shared_experts")
        moe = sum(counts[k] for k in moe_keys) // n_moe + counts["routed_experts"] // n_moe // dims.ep
    n_dense = cfg.n_layers - n_moe
    dense = counts["dense_ffn"] // n_dense if n_dense else 0
    return max(*mixers, moe, dense, counts["embeddings"])  # the root holds the embeddings


def activation_bytes(cfg: ModelConfig, tokens: int) -> dict[str, int]:
    """Activation memory for ``tokens`` local tokens with activation checkpointing (module docstring)."""
    f = cfg.ffn
    saved = tokens * 2 * cfg.n_layers * cfg.d_model * BF16_BYTES
    moe = 0
    if f.kind == "moe":
        moe = tokens * f.top_k * (2 * f.latent_dim(cfg.d_model) + 3 * f.expert_hidden) * BF16_BYTES
    logits = tokens * cfg.vocab_size * FP32_BYTES
    return {"checkpointed_inputs": saved, "moe_recompute": moe, "logits_fp32": logits}


def all_to_all_bytes(cfg: ModelConfig, dims: ParallelDims, alpha: int) -> dict[str, float]:
    """Bytes per token per MoE layer for EP dispatch + combine with latent ratio ``alpha``."""
    f = cfg.ffn
    row = cfg.d_model // alpha * BF16_BYTES
    both = 2 * f.top_k * row  # dispatch there, combine back
    off_device = both * (dims.ep - 1) / dims.ep
    n_moe = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    return {
        "latent_dim": cfg.d_model // alpha,
        "per_layer_forward": off_device,
        "per_layer_forward_backward": 2 * off_device,
        "all_layers_forward_backward": 2 * off_device * n_moe,
    }


def memory_per_device(
    cfg: ModelConfig, counts: dict[str, int], cache: dict[str, Any], dims: ParallelDims, seq_len: int
) -> dict[str, int]:
    total = sum(counts.values())
    per_copy = DTYPE_BYTES[cfg.dtype]
    tokens = -(-seq_len // dims.cp)
    act = activation_bytes(cfg, tokens)
    latent_tokens = tokens  # each device keeps the latents of its own part of the window
    out = {
        "weights": -(-total // dims.world_size) * per_copy,
        "gradients": -(-total // dims.world_size) * per_copy,
        "optimizer": OPTIMIZER_COPIES * -(-total // dims.world_size) * per_copy,
        "fsdp_gather_buffer": _unit_params(cfg, counts, dims) * per_copy,
        "activations": sum(act.values()),
        "cache": cache["kda_state_bytes_per_sequence"] + latent_tokens * cache["mla_latent_bytes_per_token"],
    }
    out["total"] = sum(out.values())
    return out


def plan(
    cfg: ModelConfig,
    counts: dict[str, int],
    cache: dict[str, Any],
    dims: ParallelDims,
    seq_len: int = ONE_M,
    device_memory: int = 80 * 2**30,
) -> dict[str, Any]:
    """Per-device memory, EP all-to-all bytes per token (α = 1, config, 4), and the CP degree for 1M."""
    alphas = sorted({1, cfg.ffn.latent_ratio, 4}) if cfg.ffn.kind == "moe" else []
    cp_1m = None
    cp = 1
    while cp <= MAX_CP:
        d = ParallelDims(dims.dp_shard, dims.ep, cp)
        if memory_per_device(cfg, counts, cache, d, ONE_M)["total"] <= device_memory:
            cp_1m = cp
            break
        cp *= 2
    tokens = -(-seq_len // dims.cp)
    return {
        "dims": {"dp_shard": dims.dp_shard, "ep": dims.ep, "cp": dims.cp, "world": dims.world_size},
        "seq_len": seq_len,
        "tokens_per_device": tokens,
        "experts_per_device": cfg.ffn.n_experts // dims.ep if cfg.ffn.kind == "moe" else 0,
        "memory_per_device": memory_per_device(cfg, counts, cache, dims, seq_len),
        "activation_terms": activation_bytes(cfg, tokens),
        "all_to_all_bytes_per_token": {str(a): all_to_all_bytes(cfg, dims, a) for a in alphas},
        "device_memory": device_memory,
        "cp_for_1m_tokens": cp_1m,
    }


def _bytes(n: float) -> str:
    for div, s in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= div:
            return f"{n / div:.3g} {s}"
    return f"{n:.0f} B"


def format_plan(p: dict[str, Any], cfg: ModelConfig) -> str:
    d = p["dims"]
    lines = [
        f"  parallel layout: dp_shard={d['dp_shard']} × ep={d['ep']} × cp={d['cp']} = {d['world']} devices; "
        f"{p['experts_per_device']} routed experts and {p['tokens_per_device']:,} of {p['seq_len']:,} "
        "window tokens per device",
        f"  {'memory per device':<22}{'bytes':>12}",
    ]
    for k, v in p["memory_per_device"].items():
        lines.append(f"  {k:<22}{_bytes(v):>12}")
    lines.append(
        "  activations: "
        + ", ".join(f"{k} {_bytes(v)}" for k, v in p["activation_terms"].items())
        + " (activation checkpointing)"
    )
    if p["all_to_all_bytes_per_token"]:
        lines.append(
            f"  {'EP all-to-all / token':<22}{'ℓ':>6}{'per layer fwd':>16}{'fwd+bwd':>12}{'all layers':>14}"
        )
        for a, v in p["all_to_all_bytes_per_token"].items():
            mark = " (config)" if int(a) == cfg.ffn.latent_ratio else ""
            lines.append(
                f"  {'α = ' + a + mark:<22}{v['latent_dim']:>6}{_bytes(v['per_layer_forward']):>16}"
                f"{_bytes(v['per_layer_forward_backward']):>12}{_bytes(v['all_layers_forward_backward']):>14}"
            )
    cp = p["cp_for_1m_tokens"]
    budget = _bytes(p["device_memory"])
    lines.append(
        f"  CP degree for a 1M-token window within {budget}/device: {cp}"
        if cp
        else f"  a 1M-token window does not fit {budget}/device at any cp <= {MAX_CP} with these degrees"
    )
    return "\n".join(lines)
