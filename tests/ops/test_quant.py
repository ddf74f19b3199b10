"""Weight-only quantization ops (ops/quant.py): packed kernels against the dequantize-then-matmul
reference, quantization error bounds, adversarial weights, and the quantized experts against ops/moe."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longmoe.ops.moe import dense_reference, route
from longmoe.ops.quant import (
    INT4_GROUPS,
    dequantize,
    dequantize_int4,
    dequantize_int8,
    int4_group,
    int8_gathered_reduction,
    quantize_int4,
    quantize_int8,
    quantize_weight,
    quantized_experts,
    quantized_linear,
    reference_linear,
)


def _unpacked(w: torch.Tensor, mode: str, group: int = 32):
    if mode == "int8":
        return (*quantize_int8(w), 0)
    g = int4_group(w.shape[1], group)
    return (*quantize_int4(w, g), g)


def _kernel_vs_reference(w: torch.Tensor, x: torch.Tensor, mode: str) -> None:
    """In fp32 compute the kernels (and int8's dequantize + GEMM for many rows) equal the reference to
    rounding; in bf16 (the default, vectorised path) to bf16 rounding of activations and output."""
    _check(w, x, mode, torch.float32, 1e-4)
    _check(w, x, mode, torch.bfloat16, 2e-2)


def _check(w: torch.Tensor, x: torch.Tensor, mode: str, dtype: torch.dtype, tol: float) -> None:
    qw = quantize_weight(w, mode, compute_dtype=dtype)
    w = w.to(dtype).float()
    n_pad = qw.qweight.shape[0]
    wp = torch.cat([w, w.new_zeros(n_pad - w.shape[0], w.shape[1])]) if mode == "int4" else w
    q, s, g = _unpacked(wp, mode)
    ref = reference_linear(x, q, s, mode, g)[..., : w.shape[0]]
    out = quantized_linear(x, qw)
    assert out.shape == (*x.shape[:-1], w.shape[0])
    # the kernel and the reference compute the same dequantized product; only summation order differs
    assert out.dtype == x.dtype
    torch.testing.assert_close(out, ref, atol=tol * (1 + ref.abs().max().item()), rtol=tol)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@settings(max_examples=20, deadline=None)
@given(
    n16=st.integers(1, 12),
    extra=st.integers(0, 15),
    kg=st.integers(1, 4),
    rows=st.sampled_from([1, 2, 5, 17, 40]),
    seed=st.integers(0, 2**16),
)
def test_packed_kernel_matches_reference(mode, n16, extra, kg, rows, seed):
    """Random shapes (N not a multiple of 16 included: int4 pads and slices) and 1-3-D inputs: the packed
    kernel equals the dequantize-then-matmul reference to fp32 rounding."""
    g = torch.Generator().manual_seed(seed)
    N, K = 16 * n16 - extra if 16 * n16 > extra else 16 * n16, 32 * kg
    w = torch.randn(N, K, generator=g)
    x = (
        torch.randn(rows, 2, K, generator=g) if rows % 2 else torch.randn(rows, K, generator=g)
    )  # > 32 rows too
    _kernel_vs_reference(w, x, mode)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_adversarial_weights(mode):
    """Outlier channels, all-zero rows and groups, constant rows, tiny magnitudes: no NaN/inf, zeros stay
    exactly zero, and the kernel still matches the reference."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 128, generator=g) * 0.02
    w[3] *= 1e4  # an outlier output channel
    w[:, 7] = 300.0  # an outlier input channel (one entry of every group-row)
    w[10] = 0.0  # an all-zero row
    w[11, :32] = 0.0  # an all-zero group
    w[12] = 0.5  # a constant row
    w[13] *= 1e-30  # denormal-scale values
    x = torch.randn(5, 128, generator=g)
    _kernel_vs_reference(w, x, mode)
    deq = dequantize(quantize_weight(w, mode, compute_dtype=torch.float32))
    assert torch.isfinite(deq).all()
    assert (deq[10] == 0).all()
    if mode == "int4":
        assert (deq[11, :32] == 0).all()
        torch.testing.assert_close(deq[12], w[12], atol=1e-6, rtol=0)  # constant groups are exact
    out = quantized_linear(x, quantize_weight(w, mode, compute_dtype=torch.float32))
    assert torch.isfinite(out).all() and (out[:, 10] == 0).all()


@pytest.mark.parametrize("mode,bound", [("int8", 0.5 / 127), ("int4", 0.5 / 15)])
def test_quantization_error_bound(mode, bound):
    """Round-to-nearest: each weight is off by at most half a step (int8: max|row|/254; int4: (max-min)/30
    of its group)."""
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(1))
    if mode == "int8":
        q, s = quantize_int8(w)
        err, step = (dequantize_int8(q, s) - w).abs(), w.abs().amax(1, keepdim=True)
    else:
        q, sz = quantize_int4(w, 64)
        wg = w.view(64, 4, 64)
        err = (dequantize_int4(q, sz, 64) - w).abs().view(64, 4, 64)
        step = wg.amax(-1, keepdim=True) - wg.amin(-1, keepdim=True)
    assert (err <= bound * step * (1 + 1e-5) + 1e-7).all()


def test_dequantize_reads_back_the_packed_weight():
    """``dequantize`` of a packed int4 weight (through the kernel) equals the unpacked dequantization."""
    w = torch.randn(40, 64, generator=torch.Generator().manual_seed(2))
    qw = quantize_weight(w, "int4", group_size=32, compute_dtype=torch.float32)
    q, sz = quantize_int4(torch.cat([w, w.new_zeros(8, 64)]), 32)
    torch.testing.assert_close(dequantize(qw), dequantize_int4(q, sz, 32)[:40], atol=1e-5, rtol=1e-5)


def test_int4_group_choice_and_errors():
    assert int4_group(128, 32) == 32 and int4_group(192, 128) == 64 and int4_group(16, 32) is None
    assert set(INT4_GROUPS) == {32, 64, 128, 256}
    with pytest.raises(ValueError, match="in_features 16"):
        quantize_weight(torch.randn(16, 16), "int4")
    with pytest.raises(ValueError, match="quantize: expected one of"):
        quantize_weight(torch.randn(16, 32), "fp8")


def test_bf16_activations():
    """bf16 weights keep bf16 scales; the kernels take bf16 activations and return bf16."""
    w = torch.randn(32, 64).bfloat16()
    x = torch.randn(3, 64).bfloat16()
    for mode in ("int8", "int4"):
        y = quantized_linear(x, quantize_weight(w, mode))
        assert y.dtype == torch.bfloat16
        rel = (y.float() - x.float() @ w.float().t()).norm() / (x.float() @ w.float().t()).norm()
        assert rel < (0.02 if mode == "int8" else 0.15)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("N", [1, 3, 40])
def test_quantized_experts_match_dense_reference(mode, N):
    """Per-expert packed experts equal ops/moe's dense reference run on the dequantized weights, for
    decode-sized and prefill-sized batches (idle experts included)."""
    g = torch.Generator().manual_seed(3)
    E, k, l, f = 6, 2, 64, 32
    z = torch.randn(N, l, generator=g)
    w_in = torch.randn(E, l, 2 * f, generator=g) / l**0.5  # stored [E, in, out]
    w_out = torch.randn(E, f, l, generator=g) / f**0.5
    _, idx, w = route(torch.randn(N, E, generator=g), torch.zeros(E), k)
    qi = quantize_weight(w_in.transpose(1, 2), mode, compute_dtype=torch.float32)  # [E, 2f, l] out x in
    qo = quantize_weight(w_out.transpose(1, 2), mode, compute_dtype=torch.float32)  # [E, l, f]
    out = quantized_experts(z, idx, w, qi, qo)
    deq_in = torch.stack([dequantize(qi.expert(e)) for e in range(E)]).transpose(1, 2)
    deq_out = torch.stack([dequantize(qo.expert(e)) for e in range(E)]).transpose(1, 2)
    ref = dense_reference(z, idx, w, deq_in, deq_out)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    full = dense_reference(z, idx, w, w_in, w_out)
    rel = (out - full).norm() / full.norm()
    assert rel < (0.02 if mode == "int8" else 0.3), rel  # and near the unquantized experts


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("N", [1, 2])
def test_quantized_experts_compile_without_a_graph_break(mode, N):
    """torch.compile(fullgraph=True) traces a step through the packed experts: a custom op, or for one
    int8 token on CPU the int8 reductions (``int8_gathered_reduction``), with the op's values."""
    g = torch.Generator().manual_seed(4)
    E, l, f = 4, 64, 32
    qi = quantize_weight(torch.randn(E, 2 * f, l, generator=g), mode, compute_dtype=torch.float32)
    qo = quantize_weight(torch.randn(E, l, f, generator=g), mode, compute_dtype=torch.float32)
    z, w = torch.randn(N, l, generator=g), torch.rand(N, 2, generator=g)
    idx = torch.tensor([[2, 0], [1, 2]])[:N]
    step = torch.compile(lambda z, idx, w: quantized_experts(z, idx, w, qi, qo) * 2,
                         backend="aot_eager", fullgraph=True)  # fmt: skip
    ref = quantized_experts(z, idx, w, qi, qo) * 2
    torch.testing.assert_close(step(z, idx, w), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_int8_gathered_reduction_matches_the_packed_kernel_and_reads_only_chosen_experts(seed):
    """The one-token int8 reduction equals the packed-kernel experts (both fp32 compute), with the idle
    experts' int8 rows and scales poisoned (a read of one would show as NaN or a large error)."""
    g = torch.Generator().manual_seed(seed)
    E, l, f = 6, 64, 32
    qi = quantize_weight(torch.randn(E, 2 * f, l, generator=g), "int8", compute_dtype=torch.float32)
    qo = quantize_weight(torch.randn(E, l, f, generator=g), "int8", compute_dtype=torch.float32)
    z, idx, w = torch.randn(1, l, generator=g), torch.tensor([[4, 1]]), torch.rand(1, 2, generator=g)
    ref = quantized_experts(z, idx, w, qi, qo)
    idle = torch.tensor([0, 2, 3, 5])
    for q in (qi, qo):
        q.qweight[idle] = 127
        q.scales[idle] = float("nan")
    out = int8_gathered_reduction(z, idx, w, qi, qo, "swiglu")
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
