"""``kda_chunk(..., intra="logspace" | "subchunk")``: the exact in-chunk paths for unbounded gates
(Kimi-Linear's ``kimi_decay``), against the float64 token-by-token recurrence at real gate values; each
test runs both paths (``EXACT``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from longmoe.ops.gates import kimi_decay, softplus_decay
from longmoe.ops.kda import kda_chunk, kda_recurrent
from longmoe.ops.kda.intra import intra_logspace, intra_subchunk

EXACT = ("logspace", "subchunk")
exact_modes = pytest.mark.parametrize("mode", EXACT)


def kimi_inputs(B, T, H, K, V, *, seed=0, f_scale=3.0):
    """KDA inputs with Kimi-Linear's gate at the values its checkpoints hold: ``A_log = log U(1, 16)``
    per head and ``dt_bias`` around softplus⁻¹(1), so single-token log-decays reach tens and a chunk's
    cumulative log-decay falls far below the fp32 exp limit (−88)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)
    q = F.normalize(r(B, T, H, K), dim=-1)
    k = F.normalize(r(B, T, H, K), dim=-1)
    v = r(B, T, H, V)
    A_log = torch.empty(H, 1, dtype=torch.float64).uniform_(1.0, 16.0, generator=gen).log()
    dt_bias = r(H, K) + math.log(math.expm1(1.0))
    g = kimi_decay(r(B, T, H, K) * f_scale, A_log, dt_bias)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta


def test_real_gate_values_overflow_the_factorised_form():
    q, k, v, g, beta = (x.float() for x in kimi_inputs(1, 64, 2, 16, 8))
    assert g.cumsum(1).min() < -1000  # far beyond exp's fp32 range within one 16-token chunk
    o, _ = kda_chunk(q, k, v, g, beta, intra="factorised")
    assert not torch.isfinite(o).all()


@pytest.mark.parametrize("T", [1, 15, 16, 17, 100])
@pytest.mark.parametrize("chunk_size", [16, 64])
@exact_modes
def test_exact_fp32_matches_float64_recurrence(T, chunk_size, mode):
    x64 = kimi_inputs(2, T, 3, 16, 8, seed=T)
    ref, s_ref = kda_recurrent(*x64, output_final_state=True)
    o, s = kda_chunk(*(x.float() for x in x64), output_final_state=True, chunk_size=chunk_size, intra=mode)
    assert (o.double() - ref).abs().max() < 2e-5
    assert (s.double() - s_ref).abs().max() < 2e-5


@exact_modes
def test_exact_float64_is_exact_and_carries_state(mode):
    q, k, v, g, beta = kimi_inputs(1, 50, 2, 8, 8, seed=3)
    ref, s_ref = kda_recurrent(q, k, v, g, beta, output_final_state=True)
    o1, s1 = kda_chunk(q[:, :23], k[:, :23], v[:, :23], g[:, :23], beta[:, :23], output_final_state=True,
                       intra=mode)  # fmt: skip
    o2, s2 = kda_chunk(q[:, 23:], k[:, 23:], v[:, 23:], g[:, 23:], beta[:, 23:], initial_state=s1,
                       output_final_state=True, intra=mode)  # fmt: skip
    assert (torch.cat([o1, o2], 1) - ref).abs().max() < 1e-12
    assert (s2 - s_ref).abs().max() < 1e-12


@exact_modes
def test_exact_varlen_resets_at_documents(mode):
    q, k, v, g, beta = kimi_inputs(1, 40, 2, 8, 4, seed=4)
    cu = torch.tensor([0, 9, 9, 40])
    o, _ = kda_chunk(q, k, v, g, beta, cu_seqlens=cu, intra=mode)
    for a, b in ((0, 9), (9, 40)):
        ref, _ = kda_recurrent(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b])
        assert (o[:, a:b] - ref).abs().max() < 1e-12


@exact_modes
def test_exact_equals_factorised_where_both_are_finite(mode):
    q, k, v, g, beta = kimi_inputs(1, 48, 2, 8, 8, seed=5, f_scale=0.1)
    g = g / g.abs().max() * 2.0  # |Γ| <= 32 per chunk: the factorised form is exact here too
    a, _ = kda_chunk(q, k, v, g, beta, intra="factorised")
    b, _ = kda_chunk(q, k, v, g, beta, intra=mode)
    assert (a - b).abs().max() < 1e-12


@exact_modes
def test_exact_gradients_are_finite_and_match_recurrence(mode):
    xs = [x.float().requires_grad_() for x in kimi_inputs(1, 40, 2, 8, 8, seed=6)]
    o, _ = kda_chunk(*xs, intra=mode)
    grads = torch.autograd.grad(o.square().sum(), xs)
    xr = [x.detach().double().requires_grad_() for x in xs]
    ref, _ = kda_recurrent(*xr)
    rgrads = torch.autograd.grad(ref.square().sum(), xr)
    for gc, gr in zip(grads, rgrads, strict=True):
        assert torch.isfinite(gc).all()
        assert (gc.double() - gr).abs().max() < 1e-3 * (1 + gr.abs().max())


def test_intra_mode_is_validated():
    q, k, v, g, beta = kimi_inputs(1, 4, 1, 4, 4)
    with pytest.raises(ValueError, match="intra"):
        kda_chunk(q, k, v, g, beta, intra="exact")


# ---------------------------------------------------------------- the unbounded baseline, adversarially
def adversarial_gates(B, T, H, K, *, seed=0):
    """Per-token log-decays mixing the regimes an unbounded gate can reach in one chunk: no decay (0),
    near-zero (−1e-6), ordinary (−U(0, 5)), far past the bounded gate's floor (−U(5, 100)) and
    effectively total erasure (−1e4), shuffled per channel so a chunk's Γ jumps between them."""
    gen = torch.Generator().manual_seed(seed)
    regimes = torch.tensor([0.0, -1e-6, -2.5, -50.0, -1e4], dtype=torch.float64)
    pick = torch.randint(0, len(regimes), (B, T, H, K), generator=gen)
    jitter = torch.rand(B, T, H, K, generator=gen, dtype=torch.float64)
    g = regimes[pick] * (0.5 + jitter)  # −1e4 → [−1.5e4, −5e3]; 0 stays 0
    return g


def adversarial_inputs(B, T, H, K, V, *, seed=0):
    q, k, v, _, beta = kimi_inputs(B, T, H, K, V, seed=seed)
    return q, k, v, adversarial_gates(B, T, H, K, seed=seed + 1), beta


def softplus_inputs(B, T, H, K, V, *, seed=0, h_scale=4.0, a_scale=1.5):
    """The ablation's unbounded gate ``−e^A·softplus(h)`` with wide pre-activations and scales, so
    per-token log-decays range from ≈0 to the hundreds (the model's ``kda_gate="softplus"``)."""
    q, k, v, _, beta = kimi_inputs(B, T, H, K, V, seed=seed)
    gen = torch.Generator().manual_seed(seed + 7)
    h = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) * h_scale
    A = torch.randn(H, K, generator=gen, dtype=torch.float64) * a_scale
    return q, k, v, softplus_decay(h, A), beta


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk_size", [16, 64])
@exact_modes
def test_exact_adversarial_gates_match_float64_recurrence(seed, chunk_size, mode):
    x64 = adversarial_inputs(2, 97, 2, 16, 8, seed=seed)
    assert x64[3].min() < -5000 and (x64[3] == 0).any()
    ref, s_ref = kda_recurrent(*x64, output_final_state=True)
    o, s = kda_chunk(*(x.float() for x in x64), output_final_state=True, chunk_size=chunk_size,
                     intra=mode)  # fmt: skip
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    # fp32 rounding only (≈1e-7): Γ_i − Γ_j formed as a difference of prefix sums at −1e4 was ≈1e-4 off
    assert (o.double() - ref).abs().max() < 1e-6
    assert (s.double() - s_ref).abs().max() < 1e-6


@exact_modes
def test_exact_softplus_gate_matches_float64_recurrence(mode):
    x64 = softplus_inputs(1, 200, 2, 16, 16, seed=11)
    assert x64[3].min() < -100  # one token alone exceeds the factorised form's whole-chunk budget
    ref, _ = kda_recurrent(*x64)
    o, _ = kda_chunk(*(x.float() for x in x64), intra=mode)
    assert (o.double() - ref).abs().max() < 2e-5
    bad, _ = kda_chunk(*(x.float() for x in x64), intra="factorised")
    assert not torch.isfinite(bad).all()  # the all-GEMM form cannot run this gate


@exact_modes
def test_exact_long_sequence_matches_float64_recurrence(mode):
    """2,048 tokens (128 chunks of state carried through unbounded decays) stay at fp32 accuracy."""
    x64 = kimi_inputs(1, 2048, 2, 16, 16, seed=12)
    ref, s_ref = kda_recurrent(*x64, output_final_state=True)
    o, s = kda_chunk(*(x.float() for x in x64), output_final_state=True, intra=mode)
    assert (o.double() - ref).abs().max() < 5e-5
    assert (s.double() - s_ref).abs().max() < 5e-5


@pytest.mark.parametrize("make", [kimi_inputs, adversarial_inputs], ids=["kimi", "adversarial"])
@exact_modes
def test_exact_bf16_matches_float64_recurrence_of_the_rounded_inputs(make, mode):
    """bf16 inputs (computed in fp32 inside) against the float64 recurrence of the same bf16-rounded
    values: only the bf16 rounding of the output is left."""
    xb = tuple(x.to(torch.bfloat16) for x in make(1, 300, 2, 16, 16, seed=13))
    ref, _ = kda_recurrent(*(x.double() for x in xb))
    o, _ = kda_chunk(*xb, intra=mode)
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
    err = (o.double() - ref).abs()
    assert err.max() < 2e-2 * (1 + ref.abs().max())
    assert err.mean() < 2e-3


@exact_modes
def test_exact_gradients_at_adversarial_gates_match_recurrence(mode):
    xs = [x.float().requires_grad_() for x in adversarial_inputs(1, 40, 2, 8, 8, seed=14)]
    o, _ = kda_chunk(*xs, intra=mode)
    grads = torch.autograd.grad(o.square().sum(), xs)
    xr = [x.detach().double().requires_grad_() for x in xs]
    ref, _ = kda_recurrent(*xr)
    rgrads = torch.autograd.grad(ref.square().sum(), xr)
    for gc, gr in zip(grads, rgrads, strict=True):
        assert torch.isfinite(gc).all()
        assert (gc.double() - gr).abs().max() < 1e-3 * (1 + gr.abs().max())


# ---------------------------------------------------------------- the sub-chunk split itself
@pytest.mark.parametrize(("C", "sub"), [(16, 1), (16, 2), (16, 4), (16, 8), (64, 1), (8, 2), (32, 4)])
def test_subchunk_products_equal_logspace_at_every_split(C, sub):
    """The in-chunk products themselves, float64, adversarial gates: every halving level and every
    diagonal block size gives the pairwise form's matrix (zeros above the diagonal included)."""
    gen = torch.Generator().manual_seed(C + sub)
    kq = torch.randn(3, 2, 2, C, 8, generator=gen, dtype=torch.float64)
    g = adversarial_gates(3, 2, C, 8, seed=C * sub)
    ref = intra_logspace(kq, g)
    got = intra_subchunk(kq, g, sub)
    assert got.shape == ref.shape == (3, 2, 2 * C, C)
    assert (got - ref).abs().max() < 1e-12


@pytest.mark.parametrize(("C", "sub"), [(5, 1), (12, 1), (16, 16), (16, 3), (4, 0)])
def test_subchunk_falls_back_where_the_halving_does_not_fit(C, sub):
    """A chunk that is not ``sub`` times a power of two (or a ``sub`` that is not smaller) is computed
    by the pairwise form: same values, no error."""
    kq = torch.randn(2, 2, 2, C, 4, dtype=torch.float64)
    g = -torch.rand(2, 2, C, 4, dtype=torch.float64) * 30
    assert (intra_subchunk(kq, g, sub) - intra_logspace(kq, g)).abs().max() < 1e-12


def test_subchunk_takes_strided_inputs():
    """Views (as a caller slicing a larger buffer would pass) give the contiguous inputs' products."""
    kq = torch.randn(2, 2, 2, 16, 6, dtype=torch.float64)
    g = adversarial_gates(2, 2, 16, 6, seed=5)
    kq_t = kq.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    g_t = g.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not kq_t.is_contiguous() and not g_t.is_contiguous()
    assert (intra_subchunk(kq_t, g_t) - intra_logspace(kq, g)).abs().max() < 1e-12
