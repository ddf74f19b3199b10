"""serve/gemv_pass.py: the compiled CPU step's one-row fp32 ``mm``/``addmm`` and one-row int8 kernel calls
become mul-sum reductions with the same values; anything it cannot prove one-row (a batch, a bf16 ``mm``,
a scaled ``addmm``) is kept."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from longmoe.serve.gemv_pass import OneRowGemv

aten = torch.ops.aten


def _rewritten(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    OneRowGemv()(gm.graph)
    gm.recompile()
    return gm, {n.target for n in gm.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize("bias", [False, True])
def test_one_row_linear_becomes_a_reduction_with_blas_values(bias):
    torch.manual_seed(0)
    x, W = torch.randn(1, 1, 96), torch.randn(80, 96)
    b = torch.randn(80) if bias else None
    gm, ops = _rewritten(lambda x, W, b: F.linear(x, W, b), x, W, b)
    assert not ops & {aten.mm.default, aten.addmm.default}
    assert aten.sum.dim_IntList in ops
    torch.testing.assert_close(gm(x, W, b), F.linear(x, W, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "x,W",
    [
        (torch.randn(2, 96), torch.randn(80, 96)),  # two rows: BLAS's GEMM is the right kernel
        (torch.randn(1, 96, dtype=torch.bfloat16), torch.randn(80, 96, dtype=torch.bfloat16)),
    ],
    ids=["batch", "bf16"],
)
def test_what_is_not_one_row_fp32_keeps_its_mm(x, W):
    _, ops = _rewritten(lambda x, W: F.linear(x, W), x, W)
    assert aten.mm.default in ops


def test_scaled_addmm_is_kept():
    x, W, b = torch.randn(1, 96), torch.randn(96, 80), torch.randn(80)
    gm, ops = _rewritten(lambda x, W, b: torch.addmm(b, x, W, beta=0.5), x, W, b)
    assert aten.addmm.default in ops
    torch.testing.assert_close(gm(x, W, b), torch.addmm(b, x, W, beta=0.5))


@pytest.mark.parametrize("act_dtype", [torch.float32, torch.bfloat16])
def test_one_row_int8_kernel_becomes_a_reduction_with_the_kernels_values(act_dtype):
    from longmoe.ops.quant import quantize_weight

    torch.manual_seed(0)
    qw = quantize_weight(torch.randn(80, 96), "int8", compute_dtype=act_dtype)
    x = torch.randn(1, 96, dtype=act_dtype)
    kernel = aten._weight_int8pack_mm
    gm, ops = _rewritten(lambda x, q, s: kernel(x, q, s), x, qw.qweight, qw.scales)
    assert kernel.default not in ops and aten.sum.dim_IntList in ops
    out, ref = gm(x, qw.qweight, qw.scales), kernel(x, qw.qweight, qw.scales)
    assert out.dtype == ref.dtype == act_dtype
    tol = 1e-5 if act_dtype == torch.float32 else 2e-2  # bf16: both round to bf16 once at the end
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


def test_int8_kernel_of_two_rows_is_kept():
    from longmoe.ops.quant import quantize_weight

    qw = quantize_weight(torch.randn(80, 96), "int8", compute_dtype=torch.float32)
    kernel = aten._weight_int8pack_mm
    _, ops = _rewritten(lambda x, q, s: kernel(x, q, s), torch.randn(2, 96), qw.qweight, qw.scales)
    assert kernel.default in ops


def test_cache_key_is_stable_bytes():
    assert OneRowGemv().uuid() == OneRowGemv().uuid()
    assert isinstance(OneRowGemv().uuid(), bytes)
