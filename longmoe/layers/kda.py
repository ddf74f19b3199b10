"""The KDA layer: projections, short causal conv, gates and output around the ``ops/kda`` operators.

Per token: one fused projection gives ``q|k|v`` (then a depthwise causal conv of width ``W`` and SiLU),
the write strength ``β = sigmoid(·)``, a rank-``r`` decay-gate input and the output gate. ``q, k`` are
L2-normalised per head (the op expects it), the decay is ``g = g_min·sigmoid(e^A ⊙ h)`` (bounded), the
softplus baseline, or Kimi-Linear's ``-e^{A_log}·softplus(h)`` (``kda_gate="kimi"``: ``A_log`` per head,
``h`` carries ``dt_bias`` as the gate bias; the unbounded gate runs the op's log-space chunk path), and the
output is ``o_proj(RMSNorm(o) ⊙ sigmoid(W_g x))`` (``W_g`` full rank, or ``d -> r -> H·V`` with
``kda_out_gate_rank = r``).

Decode carries the recurrent state and the last ``W-1`` conv inputs, so one token costs O(1) in the
context length. Packed documents reset both: the op resets the state at ``cu_seqlens`` and the conv
masks taps that would reach into the previous document.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from longmoe.cache import KDAState, Packing
from longmoe.config import ModelConfig
from longmoe.layers.norm import GatedRMSNorm
from longmoe.ops.gates import bounded_decay, kimi_decay, softplus_decay
from longmoe.ops.kda import kda_chunk, kda_step

# decay init: per channel, -g (log-decay per token) is log-uniform in this range at init, so the layer
# starts with memories from ~10 tokens (fast channels) to ~1000 tokens (slow channels).
_INIT_DECAY_RANGE = (1e-3, 1e-1)


def _causal_conv(
    x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor | None, packing: Packing | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv as ``W`` shifted multiply-adds; returns ``(y [B, T, C], new_tail)``.

    ``x``: ``[B, T, C]``, ``weight``: ``[C, W]`` (last tap = current token), ``tail``: ``[B, W-1, C]``
    previous inputs (None = zeros). With ``packing`` a tap ``s`` tokens back is used only if it stays
    inside the token's document.
    """
    y, xp = _causal_conv_inputs(x, weight, tail, packing)
    return y, xp[:, x.shape[1] :]


def _causal_conv_inputs(
    x: torch.Tensor, weight: torch.Tensor, tail: torch.Tensor | None, packing: Packing | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_causal_conv`` returning all conv inputs ``[tail | x]`` (``[B, W-1+T, C]``) in place of the new
    tail: rows ``[p, p+W-1)`` are the tail after token ``p`` (prefix reuse keeps it at chunk edges)."""
    B, T, C = x.shape
    W = weight.shape[1]
    if tail is None:
        tail = x.new_zeros(B, W - 1, C)
    xp = torch.cat([tail.to(x.dtype), x], dim=1)  # [B, W-1+T, C]
    if T == 1 and packing is None:  # a decode step: the W taps of one token, one product and one sum
        return (xp * weight.t()).sum(1, keepdim=True), xp
    y = xp[:, W - 1 :] * weight[:, W - 1]
    for i in range(W - 1):
        s = W - 1 - i  # tokens back
        tap = xp[:, i : i + T] * weight[:, i]
        if packing is not None:
            tap = tap * (packing.doc_pos >= s).to(x.dtype)[None, :, None]
        y = y + tap
    return y, xp


class KDALayer(nn.Module):
    """KDA token mixer: ``x [B, T, d] -> [B, T, d]``, optionally continuing a ``KDAState``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, H, K = cfg.d_model, cfg.kda_heads, cfg.kda_head_dim
        self.H, self.K, self.V, self.r = H, K, K, cfg.kda_gate_rank
        self.conv_size, self.chunk_size = cfg.kda_conv_size, cfg.kda_chunk_size
        self.gate_kind, self.g_min, self.eps = cfg.kda_gate, cfg.g_min, cfg.norm_eps
        self.l2_eps = cfg.kda_l2_eps
        self.intra = "subchunk" if self.gate_kind == "kimi" else "factorised"  # the op's in-chunk path
        self.qkv_dim = 3 * H * K
        og = cfg.kda_out_gate_rank or H * self.V
        self.splits = (self.qkv_dim, H, self.r, og)  # q|k|v, β, gate rank, output gate (or its rank)
        self.in_proj = nn.Linear(d, sum(self.splits), bias=False)
        self.out_gate_up = nn.Linear(og, H * self.V, bias=False) if cfg.kda_out_gate_rank else None
        self.conv_weight = nn.Parameter(torch.empty(self.qkv_dim, self.conv_size))  # [C, W]
        self.gate_up = nn.Linear(self.r, H * K, bias=True)  # rank-r decay gate; bias sets the init decay
        # log-scale of the gate (e^A ⊙ h): per channel, or per head for Kimi-Linear's A_log
        self.A = nn.Parameter(torch.zeros(H, 1 if self.gate_kind == "kimi" else K))
        self.out_norm = GatedRMSNorm(self.V, cfg.norm_eps)
        self.o_proj = nn.Linear(H * self.V, d, bias=False)

    @staticmethod
    def param_count(cfg: ModelConfig) -> int:
        d, H, K, r, W = cfg.d_model, cfg.kda_heads, cfg.kda_head_dim, cfg.kda_gate_rank, cfg.kda_conv_size
        og = cfg.kda_out_gate_rank
        out_gate = d * H * K if og == 0 else og * (d + H * K)
        A = H if cfg.kda_gate == "kimi" else H * K
        in_proj = d * (3 * H * K + H + r)
        return in_proj + out_gate + 3 * H * K * W + (r * H * K + H * K) + A + K + H * K * d

    @torch.no_grad()
    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        nn.init.normal_(self.gate_up.weight, std=std)
        if self.out_gate_up is not None:
            nn.init.normal_(self.out_gate_up.weight, std=std)
        nn.init.normal_(self.o_proj.weight, std=out_std)
        bound = 1.0 / math.sqrt(self.conv_size)  # PyTorch's default depthwise-conv init
        nn.init.uniform_(self.conv_weight, -bound, bound)
        self.A.zero_()
        lo, hi = _INIT_DECAY_RANGE
        neg_g = torch.exp(torch.empty(self.H * self.K).uniform_(math.log(lo), math.log(hi)))
        if self.gate_kind == "bounded":  # g = g_min·sigmoid(b)  =>  b = logit(-g / -g_min)
            p = neg_g / -self.g_min
            self.gate_up.bias.copy_(torch.log(p) - torch.log1p(-p))
        else:  # g = -softplus(b)  =>  b = log(expm1(-g))
            self.gate_up.bias.copy_(torch.log(torch.expm1(neg_g)))
        self.out_norm.weight.fill_(1.0)

    def forward(
        self, x: torch.Tensor, state: KDAState | None = None, packing: Packing | None = None
    ) -> torch.Tensor:
        """``x [B, T, d]``; ``state`` (updated in place) continues a cached sequence."""
        B, T, _ = x.shape
        q, k, v, g, beta, out_gate, xp = self._features(x, None if state is None else state.conv, packing)
        tail = xp[:, T:]  # [B, W-1, C]
        recording = None if state is None else state.chunk_states  # prefix reuse: states at chunk ends
        # the operator chooses its own precision (fp32 state and scan for bf16 inputs): keep autocast out
        # (entered only when on: an autocast region in a compiled graph bypasses AOTAutograd's disk cache)
        dev = x.device.type
        on = torch.is_autocast_enabled(dev)
        with torch.autocast(device_type=dev, enabled=False) if on else contextlib.nullcontext():
            if state is not None and T == 1:  # decode: one step of the recurrence
                o, new_state = kda_step(
                    q[:, 0], k[:, 0], v[:, 0], g[:, 0].to(q.dtype), beta[:, 0].to(q.dtype), state.state
                )
                o = o.unsqueeze(1)  # [B, 1, H, V]
            else:
                o, new_state, *chunk_states = kda_chunk(
                    q,
                    k,
                    v,
                    g.to(q.dtype),
                    beta.to(q.dtype),
                    initial_state=None if state is None else state.state,
                    output_final_state=state is not None,
                    cu_seqlens=None if packing is None else packing.cu_seqlens,
                    chunk_size=self.chunk_size,
                    intra=self.intra,
                    return_chunk_states=recording is not None,
                )  # [B, T, H, V]
                if recording is not None:  # the state and conv tail after each full chunk inside the call
                    C, W = self.chunk_size, self.conv_size
                    for j, s in enumerate(chunk_states[0][: (T - 1) // C]):  # [B, H, K, V]
                        recording.append(((j + 1) * C, s, xp[:, (j + 1) * C : (j + 1) * C + W - 1]))
        if state is not None:
            # a copy with canonical strides: not a view holding the inputs alive, and one stride pattern
            # whatever T was (compiled steps guard on strides)
            state.state, state.conv = new_state, tail.detach().clone(memory_format=torch.contiguous_format)
        return self.output(o, out_gate)

    def features(
        self, x: torch.Tensor, conv_tail: torch.Tensor | None, packing: Packing | None
    ) -> tuple[torch.Tensor, ...]:
        """The operator's inputs for ``x [B, T, d]`` (after ``conv_tail [B, W-1, C]``, None = zeros).

        Returns ``(q, k [B, T, H, K] L2-normalised, v [B, T, H, V], g [B, T, H, K] fp32 log-decay,
        β [B, T, H] fp32, output gate [B, T, H·V], new conv tail [B, W-1, C])``. Packed documents mask
        the conv taps with ``packing.doc_pos``. (Also the seam context parallelism builds on.)
        """
        *out, xp = self._features(x, conv_tail, packing)
        return (*out, xp[:, x.shape[1] :])

    def _features(
        self, x: torch.Tensor, conv_tail: torch.Tensor | None, packing: Packing | None
    ) -> tuple[torch.Tensor, ...]:
        """``features`` with the conv inputs ``[tail | qkv]`` ``[B, W-1+T, C]`` in place of the new tail."""
        B, T, _ = x.shape
        H, K = self.H, self.K
        qkv, beta, gate_in, out_gate = self.in_proj(x).split(self.splits, dim=-1)
        qkv, xp = _causal_conv_inputs(qkv, self.conv_weight, conv_tail, packing)
        q, k, v = F.silu(qkv).view(B, T, 3, H, K).unbind(2)  # [B, T, H, K] each
        q, k = self._l2(q), self._l2(k)
        beta = torch.sigmoid(beta.float())  # [B, T, H]
        h = self.gate_up(gate_in).float().view(B, T, H, K)
        A = self.A.float()
        if self.gate_kind == "bounded":
            g = bounded_decay(h, A, self.g_min)
        elif self.gate_kind == "kimi":
            g = kimi_decay(h, A)
        else:
            g = softplus_decay(h, A)
        return q, k, v, g, beta, out_gate, xp

    def output(self, o: torch.Tensor, out_gate: torch.Tensor) -> torch.Tensor:
        """``o_proj(RMSNorm(o) ⊙ sigmoid(gate))``: operator output ``o [B, T, H, V]`` -> ``[B, T, d]``."""
        B, T, H, V = o.shape
        if self.out_gate_up is not None:  # the low-rank output gate's second factor
            out_gate = self.out_gate_up(out_gate)
        o = self.out_norm(o, out_gate.view(B, T, H, V))
        return self.o_proj(o.reshape(B, T, H * V))  # [B, T, d]

    def _l2(self, x: torch.Tensor) -> torch.Tensor:
        """Per-head L2 normalisation: ``x / max(|x|, 1e-12)``, or ``x / sqrt(|x|² + eps)`` in fp32 with
        ``kda_l2_eps`` (flash-linear-attention's and Kimi-Linear's form)."""
        if self.l2_eps is None:
            return F.normalize(x, dim=-1)
        xf = x.float()
        return (xf / torch.sqrt((xf * xf).sum(-1, keepdim=True) + self.l2_eps)).to(x.dtype)

    def new_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> KDAState:
        return KDAState(
            state=torch.zeros(batch_size, self.H, self.K, self.V, device=device, dtype=torch.float32),
            conv=torch.zeros(batch_size, self.conv_size - 1, self.qkv_dim, device=device, dtype=dtype),
        )
