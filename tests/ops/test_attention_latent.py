"""``latent_attention``: absorbed-MLA attention against shared latent rows after a cached prefix, as
fused mask-free calls (the prefix split into pieces, merged by log-sum-exps), against the one masked
call (``latent_attention_reference``); its memory does not grow with a ``[T, S]`` mask."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from longmoe.ops.attention import latent, latent_attention, latent_attention_reference


def q_rows(B, H, P, T, C, *, seed=0, logit_scale=1.0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, C, generator=gen) * logit_scale
    return q.to(dtype), torch.randn(B, P + T, C, generator=gen).to(dtype)


@pytest.mark.parametrize(
    ("P", "T"), [(0, 1), (0, 37), (1, 1), (2, 1), (5, 3), (300, 17), (17, 300), (4099, 1)]
)
@pytest.mark.parametrize("splits", [None, 1, 3, 64])
def test_equals_the_masked_call(P, T, splits):
    """Every prefix length / chunk length / number of pieces (divisible or not) gives the masked result."""
    q, rows = q_rows(2, 3, P, T, 20, seed=P + T)
    with torch.no_grad():
        got = latent_attention(q, rows, P, scale=0.3, splits=splits)
        ref = latent_attention_reference(q, rows, P, scale=0.3)
    assert got.shape == (2, 3, T, 20)
    torch.testing.assert_close(got, ref, atol=3e-6, rtol=1e-5)


def test_peaked_scores_and_a_long_prefix():
    """Logits in the hundreds (nearly all mass on one row, in some piece of the prefix or in the chunk)
    and 200,000 cached rows cut into many pieces: no overflow, the winner kept. Against float64."""
    q, rows = q_rows(1, 2, 200_000, 3, 16, seed=1, logit_scale=30.0)
    with torch.no_grad():
        got = latent_attention(q, rows, 200_000)
        exact = latent_attention_reference(q.double(), rows.double(), 200_000)
    assert latent.split_count(200_000, 6) > 8  # decode-sized: the prefix is cut into pieces
    assert torch.isfinite(got).all()
    assert (got.double() - exact).abs().max() < 1e-4


def test_one_dominant_row_in_any_piece():
    """An adversarial cache: all rows equal except one far larger row, placed in the first piece, a
    middle piece, the tail, or the new block; the output is (almost exactly) that row."""
    P, T, C = 10_000, 4, 8
    for where in (0, 5_003, P - 1, P + 2):
        rows = torch.zeros(1, P + T, C)
        rows[0, where] = 50.0
        q = torch.ones(1, 2, T, C)
        with torch.no_grad():
            got = latent_attention(q, rows, P, splits=7)
            ref = latent_attention_reference(q.double(), rows.double(), P)
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
        if where < P:  # every query sees it
            assert (got - 50.0).abs().max() < 1e-3


def test_a_million_cached_rows_against_float64():
    """A decode step over 2^20 cached rows, logits of a few units (a softmax spread over thousands of
    rows, so every fp32 sum is long): within 5e-5 of the float64 oracle. The pieces keep each sum short:
    the fp32 masked call itself, one sum over every row, is off by 5e-4 here."""
    P = 1 << 20
    q, rows = q_rows(1, 2, P, 1, 16, seed=4, logit_scale=3.0)
    with torch.no_grad():
        got = latent_attention(q, rows, P)
        exact = latent_attention_reference(q.double(), rows.double(), P)
    assert (got.double() - exact).abs().max() < 5e-5


def test_a_later_new_row_never_reaches_an_earlier_query():
    """Drafted tokens after a long prefix: a new row with logits in the hundreds for every query is seen
    by the queries at and after it only, and the queries before it equal the call without it."""
    P, T, C = 5000, 4, 16
    q, rows = q_rows(1, 2, P, T, C, seed=3)
    q = q.abs()
    rows[0, P + 2] = 100.0  # q·row ≥ 100·Σ|q| for every query
    with torch.no_grad():
        got = latent_attention(q, rows, P)
        before = latent_attention(q[:, :, :2], rows[:, : P + 2], P)
        ref = latent_attention_reference(q.double(), rows.double(), P)
    torch.testing.assert_close(got[:, :, :2], before, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=1e-5)
    assert (got[:, :, 2:] - 100.0).abs().max() < 1e-3


def test_bf16_matches_fp32_to_bf16_rounding():
    """bf16 inputs: within bf16 rounding of the fp32 result (the merge itself runs in fp32)."""
    q, rows = q_rows(1, 4, 9000, 33, 32, seed=2)
    with torch.no_grad():
        got = latent_attention(q.bfloat16(), rows.bfloat16(), 9000)
        ref = latent_attention_reference(q.bfloat16().float(), rows.bfloat16().float(), 9000)
    assert got.dtype == torch.bfloat16
    assert (got.float() - ref).abs().max() < 2e-2


def test_gradients_take_the_reference():
    """With gradients to carry, the differentiable reference runs (the fused op's lse has none)."""
    q, rows = q_rows(1, 2, 10, 3, 8)
    q.requires_grad_(True)
    latent_attention(q, rows, 10).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_wrong_shapes_are_refused():
    q, rows = q_rows(1, 2, 10, 3, 8)
    with pytest.raises(ValueError, match="rows: expected"):
        latent_attention(q, rows, 9)
    with pytest.raises(ValueError, match="rows: expected"):
        latent_attention(q, rows[..., :4], 10)


_PEAK = """
import re, torch
from longmoe.ops.attention import latent_attention
def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) << 10
torch.set_num_threads(1)
q = torch.randn(1, 2, 2048, 32); rows = torch.randn(1, {P} + 2048, 32)
open("/proc/self/clear_refs", "w").write("5")
base = hwm()
with torch.no_grad():
    latent_attention(q, rows, {P})
print("PEAK", hwm() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_memory_does_not_grow_with_a_mask():
    """A 2,048-token chunk after 131,072 cached rows: the masked call's unfused path would hold a
    [2048, 133120] mask (272 MB) and fp32 scores per head (1.1 GB each); the fused calls stay under
    64 MB above the inputs (measured as the rise of the process's peak RSS)."""
    out = subprocess.run([sys.executable, "-c", _PEAK.format(P=131_072)], capture_output=True, text=True,
                         timeout=300, check=True).stdout  # fmt: skip
    peak = int(re.search(r"PEAK (\d+)", out).group(1))
    assert peak < 64 << 20, f"peak RSS rose by {peak / 2**20:.0f} MiB"
