"""The CPU decode floor: weight bytes one decoded token reads, per precision, and the memory bandwidth.

Batch-1 decode of a small MoE model is bound by reading weights: every dense matrix, the router, the
shared expert, ``top_k`` of the routed experts, the LM head and one embedding row. Dividing those bytes
by the machine's measured read bandwidth gives the fastest a decode step can be; ``bench/cpu_serve.py``
reports each engine's ms/token as a multiple of that floor (KV/state reads, which grow with the
context for MLA layers, come on top and are not in the floor).

Precisions, by how each engine stores a tensor:

- ``fp32`` / ``f32``: 4 bytes a weight;
- ``int8`` (``longmoe.quantize`` with ``head=True``, the bench's int8 arm, ``--quantize-head``): 1 byte
  a weight plus one scale per output row in the compute dtype (bf16), for every linear but the ones
  kept float (router, MLA ``kv_up``) and the experts; the LM head is packed, as in a q8_0 file;
- ``q8_0`` (llama.cpp, ``longmoe convert --to-gguf --outtype q8_0``): blocks of 32 weights in 34
  bytes for matrices whose rows are a multiple of 32 long, f16 for other matrices; vectors, conv taps,
  ``A`` and the router stay f32 (``longmoe/interop/gguf_export.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from longmoe.config import ModelConfig
from longmoe.model import LongMoE
from longmoe.quantize import HEAD, KEEP_FLOAT

PRECISIONS = ("fp32", "int8", "f32", "q8_0")
Q8_0_BLOCK, Q8_0_BYTES = 32, 34
_F32_IN_GGUF = ("conv_weight", ".A", "router.weight")  # what gguf_export keeps f32 in every outtype


@dataclass(frozen=True)
class Tensor:
    """One parameter as decode reads it: the weights read per token, its row length, its name."""

    name: str
    active: float  # weights read per decoded token (fractional for routed experts: top_k / n_experts)
    total: int
    rows: int  # output rows of the matrix (1 for a vector)
    row_len: int  # input features (the last dim)
    kind: str = "other"  # "linear" (an nn.Linear weight), "experts" (a routed stack), "other"


def decode_tensors(cfg: ModelConfig) -> list[Tensor]:
    """Every parameter of ``LongMoE(cfg)`` with the share of it one decoded token reads (built on meta)."""
    with torch.device("meta"):
        model = LongMoE(cfg)
    f = cfg.ffn
    linears = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = []
    for name, p in model.named_parameters():
        n = p.numel()
        if name == "embed.weight":
            active = float(cfg.d_model)  # one row
        elif p.ndim == 3:  # routed expert stacks [E, out, in]
            active = n * f.top_k / f.n_experts
        else:
            active = float(n)
        rows = n // p.shape[-1] if p.ndim >= 2 else 1
        kind = "linear" if name in linears else "experts" if p.ndim == 3 else "other"
        out.append(Tensor(name, active, n, rows, p.shape[-1] if p.ndim else 1, kind))
    return out


def _bytes_per_weight(t: Tensor, precision: str) -> float:
    """Stored bytes per weight of ``t`` in ``precision`` (module docstring)."""
    matrix = t.rows > 1 and t.row_len > 1
    if precision in ("fp32", "f32") or not matrix:
        return 4.0
    if precision == "int8":
        leaf = t.name.rsplit(".", 2)[-2]
        keep = t.kind == "other" or (t.kind == "linear" and leaf in KEEP_FLOAT and leaf != HEAD)
        if keep:
            return 4.0
        return 1.0 + 2.0 / t.row_len  # int8 + a bf16 scale per row
    if precision == "q8_0":
        if any(t.name.endswith(s) for s in _F32_IN_GGUF):
            return 4.0
        return Q8_0_BYTES / Q8_0_BLOCK if t.row_len % Q8_0_BLOCK == 0 else 2.0
    raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")


def active_bytes(cfg: ModelConfig, precision: str) -> dict[str, float]:
    """Weight bytes read per decoded token, by part (``embed``, ``lm_head``, ``routed``, ``other``) and
    ``total``."""
    parts = {"embed": 0.0, "lm_head": 0.0, "routed": 0.0, "other": 0.0}
    for t in decode_tensors(cfg):
        b = t.active * _bytes_per_weight(t, precision)
        key = "embed" if t.name == "embed.weight" else "lm_head" if t.name == "lm_head.weight" else None
        parts[key or ("routed" if t.active < t.total and t.rows > 1 else "other")] += b
    parts["total"] = sum(parts.values())
    return parts


def weight_bytes(cfg: ModelConfig, precision: str) -> float:
    """Bytes of all weights stored in ``precision`` (the file / resident size, not per token)."""
    return sum(t.total * _bytes_per_weight(t, precision) for t in decode_tensors(cfg))


def active_flops(cfg: ModelConfig, context: int) -> float:
    """Forward FLOPs of one token at position ``context``: 2 per active matrix weight (no embedding
    lookup) plus attention: MLA scores and values over ``context`` latents per head, and the KDA
    state update and read (about 4 K·V per head)."""
    mats = sum(t.active for t in decode_tensors(cfg) if t.rows > 1 and t.name != "embed.weight")
    n_mla = cfg.layer_types.count("M")
    n_kda = cfg.layer_types.count("L")
    qk = cfg.mla_head_dim + cfg.mla_shared_key_dim
    mla = n_mla * cfg.mla_heads * 2 * (qk + cfg.mla_v_head_dim) * context
    kda = n_kda * cfg.kda_heads * 4 * cfg.kda_head_dim**2
    return 2 * mats + mla + kda


def prefill_flops(cfg: ModelConfig, tokens: int) -> float:
    """FLOPs of a ``tokens``-long prefill (causal: token ``i`` attends over ``i`` positions)."""
    return tokens * active_flops(cfg, 0) + (active_flops(cfg, tokens) - active_flops(cfg, 0)) * tokens / 2


def read_bandwidth(gib: float = 1.0, iters: int = 5) -> float:
    """Bytes/s of summing a ``gib`` GiB fp32 tensor with torch's current threads, best of ``iters`` (a
    slow sample on a shared machine is interference)."""
    x = torch.ones(int(gib * (1 << 30)) // 4)
    x.sum()  # fault the pages in
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def rss_bytes() -> int:
    """This process's resident memory now (``VmRSS``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
