"""The sweep's models: small ``LongMoE`` configs per layer pattern, and the NoPE control's signal.

``model_config`` builds a 2-layer model for ``L``, ``M`` and ``LM`` (a pattern is repeated to
``n_layers``, so ``L`` is two KDA layers, ``M`` two NoPE MLA layers, ``LM`` one of each) and a 4-layer
one for ``LLLM`` (the pattern needs 4 layers), with 2 heads of ``d_model / 2`` in both mixers and a
dense SwiGLU FFN (MoE routing only adds noise to a 2-layer recall probe).

``ShortConv`` is the control for NoPE attention: a depthwise causal convolution over the token
embeddings (``x + conv(x)``, initialised as the KDA layers' own short conv, before the first layer), attached
to ``LongMoE.embed`` by a forward hook, so the model itself is unchanged. It gives every position its
predecessors' tokens (what an induction head needs) and nothing else: no extra state, no absolute
position, so it works at any length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from longmoe.config import FFNConfig, ModelConfig
from longmoe.model import LongMoE

N_HEADS = 2
GATE_RANK = 16
POSITIONS = ("none", "conv")  # the control: nothing, or a short causal conv on the embeddings
CONV_WIDTH = 4


def n_layers_for(pattern: str) -> int:
    """2 layers where the pattern allows (its length divides 2), else the pattern's length."""
    return 2 if 2 % len(pattern) == 0 else len(pattern)


def model_config(
    pattern: str,
    d_model: int,
    vocab_size: int,
    max_seq_len: int,
    attn_res: bool,
    init_std: float = 0.02,
    logn_scale: float = 0.0,
) -> ModelConfig:
    """A small dense-FFN ``LongMoE`` config for the MQAR sweep (see the module docstring);
    ``logn_scale``: the MLA layers' log-length scaling (``ModelConfig.mla_logn_scale``, 0.0 = off)."""
    head = d_model // N_HEADS
    n = n_layers_for(pattern)
    return ModelConfig(
        vocab_size=vocab_size, d_model=d_model, n_layers=n, layer_pattern=pattern, max_seq_len=max_seq_len,
        kda_heads=N_HEADS, kda_head_dim=head, kda_gate_rank=GATE_RANK,
        mla_heads=N_HEADS, mla_q_lora_rank=0, mla_kv_lora_rank=d_model, mla_head_dim=head,
        mla_v_head_dim=head, mla_logn_scale=logn_scale, attn_res=attn_res, attn_res_blocks=n,
        init_std=init_std,
        ffn=FFNConfig(kind="dense", dense_hidden=2 * d_model),
    )  # fmt: skip


def kda_state_numbers(cfg: ModelConfig) -> int:
    """Numbers in the recurrent state of all KDA layers (heads · K · V each)."""
    return sum(cfg.kda_heads * cfg.kda_head_dim**2 for t in cfg.layer_types if t == "L")


class ShortConv(nn.Module):
    """``x + depthwise_causal_conv(x)`` over ``[B, T, d]``; taps ``U(±1/sqrt(width))`` at init, as the
    KDA layers' conv (zero taps would give attention no previous-token signal to match on, so the
    taps would get no gradient towards one: a run stays on the plateau)."""

    def __init__(self, d_model: int, width: int = CONV_WIDTH) -> None:
        super().__init__()
        self.width = width
        bound = 1.0 / math.sqrt(width)  # PyTorch's default depthwise-conv init, as in KDALayer
        self.weight = nn.Parameter(torch.empty(d_model, 1, width).uniform_(-bound, bound))  # last tap: now

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.conv1d(F.pad(x.transpose(1, 2), (self.width - 1, 0)), self.weight, groups=x.shape[-1])
        return x + y.transpose(1, 2)

    def attach(self, model: LongMoE) -> RemovableHandle:
        """Apply to the output of ``model.embed`` from now on."""
        return model.embed.register_forward_hook(lambda _m, _args, out: self(out))


def build(cfg: ModelConfig, position: str) -> tuple[LongMoE, nn.Module]:
    """The model, and the module whose parameters train (the model plus the control's conv)."""
    if position not in POSITIONS:
        raise ValueError(f"position={position!r} is invalid: expected one of {POSITIONS}")
    model = LongMoE(cfg)
    if position == "none":
        return model, model
    conv = ShortConv(cfg.d_model)
    conv.attach(model)
    return model, nn.ModuleDict({"model": model, "conv": conv})
