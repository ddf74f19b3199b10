"""Weight-only quantization (int8 per channel, int4 per group) on PyTorch's own CPU kernels.

Pure tensor functions; no GEMM is written here. A weight ``W [N, K]`` (``nn.Linear`` layout, out × in)
becomes a ``QuantizedWeight`` and ``quantized_linear(x, qw) ≈ x Wᵀ``:

- ``int8``: symmetric per output channel, ``W ≈ q · s`` with ``q ∈ [-127, 127]``, ``s = max|W_n| / 127``;
  the matmul is ``torch.ops.aten._weight_int8pack_mm`` (activations stay in the model dtype).
- ``int4``: asymmetric per group of ``G`` input channels, ``W ≈ (q − 8) · s + z`` with ``q ∈ [0, 15]``,
  ``s = (max − min) / 15``, ``z = min + 8 s`` (the kernel's convention); the weight is packed by
  ``_convert_weight_to_int4pack_for_cpu`` and multiplied by ``_weight_int4pack_mm_for_cpu``. The kernel
  needs ``N % 16 == 0`` (rows are zero-padded and the output sliced) and ``G ∈ {32, 64, 128, 256}``
  dividing ``K``; ``int4_group`` picks the largest allowed group ≤ the requested one, or None.

Compute dtype: the scales' dtype, chosen at quantization time (``compute_dtype``; bf16 by default).
On x86 both CPU kernels are vectorised (AVX-512) for bf16 activations only; with fp32 activations
they take a scalar path 5-30x slower than an fp32 GEMM. So activations are cast to the compute dtype
and the result back. The kernels are GEMV-shaped (fast for a few rows, slow for many): above
``KERNEL_MAX_ROWS`` rows int8 dequantizes the weight once and runs an ordinary GEMM (same product
up to rounding); int4's packed layout is the kernel's own, so int4 always uses the kernel.

Beside each kernel call is its slow reference (``reference_linear``: dequantize, then an ordinary
matmul), and ``quantized_experts`` runs the routed GLU experts (``ops/moe``) on per-expert packed
weights, checked against ``ops/moe``'s dense reference on the dequantized weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from longmoe.ops.glu import glu_act
from longmoe.ops.moe.decode import by_expert
from longmoe.ops.moe.reduce import one_token_compiled

MODES = ("int8", "int4")
INT4_GROUPS = (256, 128, 64, 32)  # group sizes the CPU int4 kernel accepts
INT4_N_MULTIPLE = 16  # the CPU int4 packer wants the output dimension a multiple of this
INT4_ZERO = 8  # the kernel's mid-point: w = (q - 8) * scale + zero
KERNEL_MAX_ROWS = 32  # int8: rows up to which the kernel beats dequantize + GEMM (decode, small batches)
_EPS = 1e-12  # smallest scale (an all-zero row or group quantizes to zeros, never NaN)


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"quantize: expected one of {MODES}, got {mode!r}")


def int4_group(in_features: int, group_size: int) -> int | None:
    """The largest kernel-supported group ``≤ group_size`` that divides ``in_features`` (None: none does)."""
    for g in INT4_GROUPS:
        if g <= group_size and in_features % g == 0:
            return g
    return None


@dataclass
class QuantizedWeight:
    """A packed weight and what its kernel needs. Leading dims (``[E, ...]``) stack experts.

    ``int8``: ``qweight [..., N, K]`` int8, ``scales [..., N]``.
    ``int4``: ``qweight [..., N_pad, K/2]`` uint8 (the kernel's packed layout), ``scales`` =
    scales-and-zeros ``[..., K/G, N_pad, 2]``; ``group_size`` G.
    """

    mode: str
    qweight: torch.Tensor
    scales: torch.Tensor
    out_features: int
    in_features: int
    group_size: int = 0

    def expert(self, e: int) -> QuantizedWeight:
        """The 2-D weight of expert ``e`` of a stacked ``[E, ...]`` weight (views, nothing copied)."""
        return QuantizedWeight(
            self.mode, self.qweight[e], self.scales[e], self.out_features, self.in_features, self.group_size
        )

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales))


def packed_nbytes(out_features: int, in_features: int, mode: str, group_size: int, scale_bytes: int) -> int:
    """Bytes ``quantize_weight`` produces for one ``[N, K]`` weight (scales in a ``scale_bytes`` dtype)."""
    check_mode(mode)
    N, K = out_features, in_features
    if mode == "int8":
        return N * K + N * scale_bytes
    g = int4_group(K, group_size)
    if g is None:
        raise ValueError(f"int4: in_features {K} has no kernel group size in {INT4_GROUPS} <= {group_size}")
    n_pad = -(-N // INT4_N_MULTIPLE) * INT4_N_MULTIPLE
    return n_pad * K // 2 + (K // g) * n_pad * 2 * scale_bytes


# ---------------------------------------------------------------------------------------- quantizers
def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [..., N, K]`` -> ``(q [..., N, K] int8, scales [..., N] in w.dtype)``, symmetric per row."""
    wf = w.float()
    scales = (wf.abs().amax(-1) / 127.0).clamp(min=_EPS)  # [..., N]
    q = torch.round(wf / scales[..., None]).clamp(-127, 127).to(torch.int8)
    return q, scales.to(w.dtype)


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` -> ``(q [N, K] int32 in [0, 15], scales_and_zeros [K/G, N, 2] in w.dtype)``."""
    N, K = w.shape
    if K % group_size:
        raise ValueError(f"quantize_int4: in_features {K} is not a multiple of group_size {group_size}")
    wg = w.float().view(N, K // group_size, group_size)
    lo, hi = wg.amin(-1), wg.amax(-1)  # [N, K/G]
    scale = ((hi - lo) / 15.0).clamp(min=_EPS)
    q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).view(N, K)
    zero = lo + INT4_ZERO * scale
    sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()  # [K/G, N, 2]
    return q, sz.to(w.dtype)


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return q.float() * scales.float()[..., None]


def dequantize_int4(q: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """Unpacked ``q [N, K]`` and ``[K/G, N, 2]`` -> ``W [N, K]`` fp32."""
    N, K = q.shape
    sz = scales_and_zeros.float().transpose(0, 1)  # [N, K/G, 2]
    qg = q.float().view(N, K // group_size, group_size)
    return ((qg - INT4_ZERO) * sz[..., :1] + sz[..., 1:]).view(N, K)


def quantize_weight(
    w: torch.Tensor, mode: str, group_size: int = 32, compute_dtype: torch.dtype = torch.bfloat16
) -> QuantizedWeight:
    """Quantize and pack ``w [N, K]`` (or a stack ``[E, N, K]``) for ``quantized_linear``, which will
    compute in ``compute_dtype`` (the dtype the scales are stored in)."""
    check_mode(mode)
    w = w.detach().to(compute_dtype)
    if w.dim() == 3:
        parts = [quantize_weight(w[e], mode, group_size, compute_dtype) for e in range(w.shape[0])]
        p0 = parts[0]
        return QuantizedWeight(
            mode,
            torch.stack([p.qweight for p in parts]),
            torch.stack([p.scales for p in parts]),
            p0.out_features,
            p0.in_features,
            p0.group_size,
        )
    N, K = w.shape
    if mode == "int8":
        q, s = quantize_int8(w)
        return QuantizedWeight(mode, q.contiguous(), s.contiguous(), N, K)
    g = int4_group(K, group_size)
    if g is None:
        raise ValueError(f"int4: in_features {K} has no kernel group size in {INT4_GROUPS} <= {group_size}")
    n_pad = -(-N // INT4_N_MULTIPLE) * INT4_N_MULTIPLE
    wp = torch.cat([w, w.new_zeros(n_pad - N, K)]) if n_pad > N else w
    q, sz = quantize_int4(wp, g)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)  # [N_pad, K/2]
    return QuantizedWeight(mode, packed, sz, N, K, g)


# ---------------------------------------------------------------------------------------- matmuls
def quantized_linear(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """``x [..., K] -> [..., N]`` ≈ ``x Wᵀ`` with the packed weight (no bias), computed in the scales'
    dtype, returned in ``x.dtype``."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.dtype != qw.scales.dtype:
        x2 = x2.to(qw.scales.dtype)
    if qw.mode == "int8" and torch.compiler.is_compiling() and x2.shape[0] != 1:
        # a compiled ``B >= 2`` step, whose batch is symbolic: a branch on the rows here would guard it
        # (the step would recompile past KERNEL_MAX_ROWS), so the choice is made at run time in one op.
        # (``B == 1`` is static: the kernel call stays visible to the one-row pass, gemv_pass.py.)
        y = _int8_linear_op(x2, qw.qweight, qw.scales)
    elif qw.mode == "int8":
        y = _int8_linear(x2, qw.qweight, qw.scales)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, qw.qweight, qw.group_size, qw.scales)
        if y.shape[-1] != qw.out_features:
            y = y[:, : qw.out_features]
    return y.reshape(*shape[:-1], qw.out_features).to(x.dtype)


def _int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (q [N, K] int8 · scales [N])ᵀ -> [M, N]: the kernel for a few rows, else one GEMM."""
    if x.shape[0] > KERNEL_MAX_ROWS:
        return F.linear(x, q.to(x.dtype) * scales[:, None])  # dequantize once, then a GEMM
    return torch.ops.aten._weight_int8pack_mm(x, q, scales)


@torch.library.custom_op("longmoe::int8_linear", mutates_args=())
def _int8_linear_op(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _int8_linear(x, q, scales)


@_int8_linear_op.register_fake
def _int8_linear_shape(x, q, scales):  # noqa: ANN001, ANN202 (the op's schema)
    return x.new_empty(x.shape[0], q.shape[0])


def reference_linear(
    x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, mode: str, group_size: int = 0
) -> torch.Tensor:
    """The slow reference: dequantize the *unpacked* ``q`` in fp32, then an ordinary matmul."""
    w = dequantize_int8(q, scales) if mode == "int8" else dequantize_int4(q, scales, group_size)
    return (x.float() @ w.t()).to(x.dtype)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """The packed weight as ``W [N, K]`` fp32 (2-D weights). For int4 the packed layout is the
    kernel's own, so it is read back through the kernel itself: ``I_K Wᵀ = Wᵀ``."""
    if qw.mode == "int8":
        return dequantize_int8(qw.qweight, qw.scales)
    eye = torch.eye(qw.in_features, dtype=qw.scales.dtype, device=qw.qweight.device)
    return quantized_linear(eye, qw).t().float()


# ---------------------------------------------------------------------------------------- experts
def quantized_experts(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: QuantizedWeight,
    w_out: QuantizedWeight,
    glu: str = "swiglu",
) -> torch.Tensor:
    """Routed GLU experts, packed per expert: ``out[n] = Σ_j weights[n, j] · GLU_{idx[n, j]}(z[n])``.

    z [N, ℓ]; idx, weights [N, k]; ``w_in`` stacks ``[E, 2f, ℓ]`` (out × in), ``w_out`` ``[E, ℓ, f]``
    -> [N, ℓ]. The packed kernels are 2-D, so this loops over the experts that received tokens
    (``ops.moe.by_expert``: at most ``min(E, N·k)``, ``k`` per token at decode), two kernel calls each on
    the expert's views; the loop never visits an idle expert. Inference only (no autograd). A
    ``torch.library`` custom op, so a compiled step calls it as one node (no graph break).
    """
    if w_in.mode == "int8" and one_token_compiled(z):  # a compiled batch-1 CPU step: threaded reductions
        return int8_gathered_reduction(z, idx, weights, w_in, w_out, glu)
    return _quantized_experts_op(
        z, idx, weights, w_in.qweight, w_in.scales, w_out.qweight, w_out.scales, w_in.mode, glu,
        [w_in.out_features, w_in.in_features, w_in.group_size],
        [w_out.out_features, w_out.in_features, w_out.group_size],
    )  # fmt: skip


def int8_gathered_reduction(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: QuantizedWeight,
    w_out: QuantizedWeight,
    glu: str,
) -> torch.Tensor:
    """``quantized_experts`` for one token as int8 reductions (``ops/moe/reduce.py`` explains why):
    under inductor each is one threaded C++ loop reading the chosen experts' int8 rows by index and
    dequantizing in registers (no copy, no bf16 rounding of the activations).

    z [1, ℓ]; idx, weights [1, k]; w_in int8 ``[E, 2f, ℓ]``, w_out ``[E, ℓ, f]`` (out × in) -> [1, ℓ].
    """
    e = idx[0]  # [k]
    x = z[0].float()  # [ℓ]
    h = (x[None, None, :] * w_in.qweight[e].float()).sum(-1) * w_in.scales[e].float()  # [k, 2f]
    a = glu_act(h, glu)  # [k, f]
    y = (a[:, None, :] * w_out.qweight[e].float()).sum(-1) * w_out.scales[e].float()  # [k, ℓ]
    return (y * weights[0][:, None].float()).sum(0, keepdim=True).to(z.dtype)  # [1, ℓ]


@torch.library.custom_op("longmoe::quantized_experts", mutates_args=())
def _quantized_experts_op(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    in_q: torch.Tensor,
    in_s: torch.Tensor,
    out_q: torch.Tensor,
    out_s: torch.Tensor,
    mode: str,
    glu: str,
    in_shape: list[int],
    out_shape: list[int],
) -> torch.Tensor:
    w_in = QuantizedWeight(mode, in_q, in_s, *in_shape)
    w_out = QuantizedWeight(mode, out_q, out_s, *out_shape)

    def expert(e: int, x: torch.Tensor) -> torch.Tensor:
        return quantized_linear(glu_act(quantized_linear(x, w_in.expert(e)), glu), w_out.expert(e))

    return by_expert(z, idx, weights, expert)


@_quantized_experts_op.register_fake
def _quantized_experts_shape(z, *args):  # noqa: ANN001, ANN002, ANN202 (the op's schema)
    return torch.empty_like(z)
