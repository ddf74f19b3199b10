"""Weight-only quantization of a loaded model (``--quantize int8|int4``): which weights, and the bytes.

``quantize_model`` swaps, in place, every eligible ``nn.Linear`` for a ``QuantLinear`` and every MoE
layer's routed expert stacks for a ``QuantExperts`` (``layers/quant.py``, kernels in ``ops/quant.py``).
Kept in the model dtype, as weight-only schemes (GPTQ, AWQ, torchao's defaults) usually keep them:

- embeddings and the LM head (a lookup table, and the head whose errors every token's logits see);
  ``head=True`` packs the LM head too (as llama.cpp's q8_0 files do: the head is a quarter of a
  small model's decode bytes at fp32);
- MoE routers (``router``): routing is a discrete top-k; a small error flips expert choices;
- MLA ``kv_up``: absorbed decode reads its weight as the matrices ``W_uk``/``W_uv`` (``layers/mla.py``);
- norms, conv taps, gate scales and biases (vectors: negligible bytes);
- for int4, linears whose input width has no kernel group size (e.g. the KDA gate's rank 16).

Quantized layers compute in ``compute_dtype`` (bf16 by default, also for an fp32 model: the CPU
kernels are vectorised for bf16 activations only; see ``ops/quant.py``); the rest of the model keeps
its dtype.

``quantized_footprint`` gives the same accounting for a config without materialising weights (the
model is built on the ``meta`` device), which is what ``longmoe inspect --quantize`` reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from longmoe.config import ModelConfig
from longmoe.layers.moe import MoELayer
from longmoe.layers.quant import QuantExperts, QuantLinear
from longmoe.model import LongMoE
from longmoe.ops.quant import MODES, check_mode, int4_group, packed_nbytes

KEEP_FLOAT = ("router", "kv_up", "lm_head")  # linear names kept in the model dtype (module docstring)
HEAD = "lm_head"
DEFAULT_GROUP = 32  # int4 group size: the smallest the CPU kernel takes (most accurate; tiny widths)
COMPUTE_DTYPE = torch.bfloat16  # activations of quantized layers (the kernels' vectorised path)


@dataclass
class QuantPlan:
    """What ``quantize_model`` does to a model: linear names to pack, MoE layers, and the rest."""

    mode: str
    group_size: int
    linears: list[str] = field(default_factory=list)
    experts: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # linears left in float (KEEP_FLOAT or no int4 group)


def plan(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP, head: bool = False) -> QuantPlan:
    check_mode(mode)
    p = QuantPlan(mode, group_size)
    keep = tuple(k for k in KEEP_FLOAT if not (head and k == HEAD))
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            ok = leaf not in keep and (mode == "int8" or int4_group(m.in_features, group_size))
            (p.linears if ok else p.kept).append(name)
        elif isinstance(m, MoELayer) and m.w_in is not None:
            p.experts.append(name)
    return p


def quantize_model(
    model: LongMoE,
    mode: str,
    group_size: int = DEFAULT_GROUP,
    compute_dtype: torch.dtype = COMPUTE_DTYPE,
    head: bool = False,
) -> QuantPlan:
    """Quantize ``model`` in place (inference only) and return what was done. Idempotence is refused:
    quantizing twice would quantize quantization error."""
    if getattr(model, "quantization", None):
        raise ValueError(f"model is already quantized ({model.quantization}); load it again to change mode")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ValueError(f"quantize: the int8/int4 kernels are PyTorch's CPU ones; the model is on {device}")
    p = plan(model, mode, group_size, head)
    with torch.no_grad():
        for name in p.linears:
            parent, leaf = _parent(model, name)
            setattr(
                parent, leaf, QuantLinear.from_linear(getattr(parent, leaf), mode, group_size, compute_dtype)
            )
        for name in p.experts:
            moe = model.get_submodule(name)
            assert isinstance(moe, MoELayer)
            moe.quant_experts = QuantExperts.from_experts(
                moe.w_in, moe.w_out, moe.cfg.glu, mode, group_size, compute_dtype
            )
            moe.register_parameter("w_in", None)
            moe.register_parameter("w_out", None)
    model.quantization = mode
    model.eval()
    return p


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    head, _, leaf = name.rpartition(".")
    return (model.get_submodule(head) if head else model), leaf


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the model's weights: ``quantized`` (packed weights + scales), ``float`` (all parameters
    left in float), ``total``. Balancer statistics and other non-weight buffers are not counted."""
    q = 0
    for m in model.modules():
        if isinstance(m, QuantLinear | QuantExperts):
            q += sum(b.numel() * b.element_size() for b in m.buffers(recurse=False))
    f = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"quantized": q, "float": f, "total": q + f}


def quantized_footprint(
    cfg: ModelConfig,
    mode: str | None,
    group_size: int = DEFAULT_GROUP,
    compute_dtype: torch.dtype = COMPUTE_DTYPE,
    head: bool = False,
) -> dict[str, int]:
    """``weight_bytes`` of ``cfg``'s model after ``quantize_model(mode)`` (None: unquantized), computed
    from shapes on the ``meta`` device: nothing is allocated, so the flagship works too."""
    if mode is not None and mode not in MODES:
        check_mode(mode)
    with torch.device("meta"):
        model = LongMoE(cfg)
    eb = model.embed.weight.element_size()  # bytes of a float weight
    sb = torch.empty((), dtype=compute_dtype).element_size()  # bytes of a scale
    total_float = sum(p.numel() * p.element_size() for p in model.parameters())
    if mode is None:
        return {"quantized": 0, "float": total_float, "total": total_float}
    p = plan(model, mode, group_size, head)
    q = removed = 0
    for name in p.linears:
        lin = model.get_submodule(name)
        q += packed_nbytes(lin.out_features, lin.in_features, mode, group_size, sb)
        removed += lin.weight.numel() * eb
    for name in p.experts:
        moe = model.get_submodule(name)
        E, l, f2 = moe.w_in.shape
        q += E * packed_nbytes(f2, l, mode, group_size, sb) + E * packed_nbytes(
            l, f2 // 2, mode, group_size, sb
        )
        removed += (moe.w_in.numel() + moe.w_out.numel()) * eb
    return {"quantized": q, "float": total_float - removed, "total": q + total_float - removed}
