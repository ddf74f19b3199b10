"""Chunked KDA (ops/kda/chunk.py, docs/design.md §1.1) against the token-by-token loop (ops/kda/naive.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longmoe.ops.gates import bounded_decay, softplus_decay
from longmoe.ops.kda import kda_chunk, kda_recurrent

F64 = torch.float64


def make_inputs(B, T, H, K, V, *, dtype=F64, seed=0, h_scale=1.0, h_shift=0.0, beta=None, gate="bounded"):
    """Random KDA inputs with L2-normalised keys (as the layer feeds them) and bounded gates."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)
    q = r(B, T, H, K)
    k = F.normalize(r(B, T, H, K), dim=-1)
    v = r(B, T, H, V)
    h = r(B, T, H, K) * h_scale + h_shift
    A = r(H, K) * 0.5
    g = bounded_decay(h, A) if gate == "bounded" else softplus_decay(h, A)
    b = (
        torch.rand(B, T, H, generator=gen, dtype=F64)
        if beta is None
        else torch.full((B, T, H), beta, dtype=F64)
    )
    return tuple(x.to(dtype) for x in (q, k, v, g, b))


def close(a, b, tol):
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= tol, f"max abs error {err:.3e} > {tol:.1e}"


@pytest.mark.parametrize("T", [1, 15, 16, 17, 100, 1000])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_matches_recurrent_float64(T, with_state):
    """kda_chunk == kda_recurrent (outputs and final state) to 1e-10 in float64."""
    B, H, K, V = (2, 3, 8, 6) if T < 1000 else (1, 2, 16, 12)
    q, k, v, g, b = make_inputs(B, T, H, K, V, seed=T)
    s0 = torch.randn(B, H, K, V, dtype=F64) if with_state else None
    o_ref, s_ref = kda_recurrent(q, k, v, g, b, initial_state=s0, output_final_state=True)
    o, s = kda_chunk(q, k, v, g, b, initial_state=s0, output_final_state=True)
    close(o, o_ref, 1e-10)
    close(s, s_ref, 1e-10)


@pytest.mark.parametrize("shape", [(1, 4, 64, 64), (2, 2, 32, 16), (3, 1, 16, 48)])
@pytest.mark.parametrize("chunk_size", [16, 8, 4])
def test_chunk_matches_recurrent_float32(shape, chunk_size):
    """fp32 chunked vs float64 reference at 1e-4, for several head shapes and chunk sizes."""
    B, H, K, V = shape
    q, k, v, g, b = make_inputs(B, 200, H, K, V, seed=1)
    o_ref, s_ref = kda_recurrent(q, k, v, g, b, output_final_state=True)
    o, s = kda_chunk(*(x.float() for x in (q, k, v, g, b)), output_final_state=True, chunk_size=chunk_size)
    assert o.dtype == torch.float32 and s.dtype == torch.float32
    close(o.double(), o_ref, 1e-4)
    close(s.double(), s_ref, 1e-4)


def test_split_sequence_carries_state():
    """Two calls with the state carried == one call over the whole sequence (split off the chunk grid)."""
    q, k, v, g, b = make_inputs(2, 90, 2, 8, 8, seed=3)
    o_full, s_full = kda_chunk(q, k, v, g, b, output_final_state=True)
    cut = 37
    o1, s1 = kda_chunk(*(x[:, :cut] for x in (q, k, v, g, b)), output_final_state=True)
    o2, s2 = kda_chunk(*(x[:, cut:] for x in (q, k, v, g, b)), initial_state=s1, output_final_state=True)
    close(torch.cat([o1, o2], 1), o_full, 1e-10)
    close(s2, s_full, 1e-10)


@pytest.mark.parametrize("grad", [False, True])
def test_varlen_equals_each_document_alone(grad):
    """Packed documents (cu_seqlens, incl. an empty one) == each document run alone with its own state."""
    lengths = [10, 0, 33, 16, 1, 40]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    T = int(cu[-1])
    q, k, v, g, b = make_inputs(1, T, 2, 8, 6, seed=5)
    init = torch.randn(len(lengths), 2, 8, 6, dtype=F64)
    if grad:
        q.requires_grad_()
    o, s = kda_chunk(q, k, v, g, b, cu_seqlens=cu, initial_state=init, output_final_state=True)
    for d in range(len(lengths)):
        a, e = int(cu[d]), int(cu[d + 1])
        o_d, s_d = kda_recurrent(
            *(x[:, a:e] for x in (q, k, v, g, b)), initial_state=init[d : d + 1], output_final_state=True
        )
        close(o[:, a:e], o_d, 1e-10)
        close(s[d : d + 1], s_d, 1e-10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    T=st.integers(1, 70),
    H=st.integers(1, 3),
    K=st.sampled_from([1, 4, 8]),
    V=st.sampled_from([1, 3, 8]),
    h_shift=st.sampled_from([-30.0, 0.0, 30.0]),
    beta=st.sampled_from([None, 0.0, 1.0]),
    chunk=st.sampled_from([1, 4, 16]),
)
def test_property_chunk_equals_recurrent(T, H, K, V, h_shift, beta, chunk):
    """Over shapes and gate extremes (h → ±30: no decay / the strongest decay e^{-5}; β → 0 / 1)."""
    q, k, v, g, b = make_inputs(1, T, H, K, V, seed=T * 7 + K, h_shift=h_shift, beta=beta)
    o_ref, s_ref = kda_recurrent(q, k, v, g, b, output_final_state=True)
    o, s = kda_chunk(q, k, v, g, b, output_final_state=True, chunk_size=chunk)
    assert torch.isfinite(o).all()
    close(o, o_ref, 1e-9)
    close(s, s_ref, 1e-9)


def test_gradcheck_float64():
    """torch.autograd.gradcheck through kda_chunk (all five inputs and the initial state)."""
    q, k, v, g, b = make_inputs(1, 11, 2, 3, 2, seed=6)
    s0 = torch.randn(1, 2, 3, 2, dtype=F64)
    args = [x.clone().requires_grad_() for x in (q, k, v, g, b, s0)]

    def f(q, k, v, g, b, s0):
        o, s = kda_chunk(q, k, v, g, b, initial_state=s0, output_final_state=True, chunk_size=4)
        return o, s

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7)


def test_gradients_chunk_match_recurrent():
    """Gradients of kda_chunk == gradients of kda_recurrent (float64, 1e-9)."""
    q, k, v, g, b = make_inputs(2, 50, 2, 8, 4, seed=7)
    grads = []
    for fn in (kda_chunk, kda_recurrent):
        xs = [x.clone().requires_grad_() for x in (q, k, v, g, b)]
        o, s = fn(*xs, output_final_state=True)
        (o.pow(2).sum() + s.sum()).backward()
        grads.append([x.grad for x in xs])
    for gc, gr in zip(*grads):
        close(gc, gr, 1e-9)


def test_bf16_inputs_accumulate_in_fp32():
    """bf16 inputs give bf16 outputs and an fp32 state that match the fp32 computation closely."""
    q, k, v, g, b = make_inputs(1, 300, 2, 16, 16, seed=8, dtype=torch.float32)
    o32, s32 = kda_chunk(q, k, v, g, b, output_final_state=True)
    o16, s16 = kda_chunk(*(x.bfloat16() for x in (q, k, v, g, b)), output_final_state=True)
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    rel = (o16.float() - o32).norm() / o32.norm()
    assert rel < 2e-2, rel


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(k=torch.zeros(1, 5, 2, 3)), r"k: expected shape \[B, T, H, K\]"),
        (dict(v=torch.zeros(1, 5, 2)), r"v: expected a tensor of shape \[B, T, H, V\]"),
        (dict(g=torch.zeros(1, 5, 2, 4, dtype=F64)), r"g: expected dtype torch.float32"),
        (dict(beta=torch.zeros(1, 5, 3)), r"beta: expected shape \[B, T, H\]"),
        (dict(initial_state=torch.zeros(1, 2, 4, 5)), r"initial_state: expected shape \[B, H, K, V\]"),
        (dict(chunk_size=0), "chunk_size: expected a positive int"),
        (
            dict(cu_seqlens=torch.tensor([0, 3])),
            "cu_seqlens: expected non-decreasing offsets from 0 to T = 5",
        ),
        (dict(cu_seqlens=torch.tensor([0.0, 5.0])), "cu_seqlens: expected an int64"),
    ],
)
def test_bad_inputs_name_the_argument(bad, match):
    """Wrong shapes/dtypes raise ValueError naming the argument and the expected shape."""
    args = dict(
        q=torch.zeros(1, 5, 2, 4),
        k=torch.zeros(1, 5, 2, 4),
        v=torch.zeros(1, 5, 2, 3),
        g=torch.zeros(1, 5, 2, 4),
        beta=torch.zeros(1, 5, 2),
    )
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        kda_chunk(**args)


# ---- numerics: the seeds' bounded-decay claim ----------------------------------------------------------


def test_unbounded_gates_overflow_bounded_do_not():
    """Strong decay: the factorised form with −softplus gates gives inf/NaN; bounded gates stay exact."""
    kw = dict(h_scale=0.5, h_shift=20.0)  # softplus(h) ≈ 20 per token: Γ reaches ≈ −320 within a chunk
    q, k, v, g_soft, b = make_inputs(1, 64, 2, 16, 16, dtype=torch.float32, gate="softplus", **kw)
    assert g_soft.min() < -10
    o_soft, _ = kda_chunk(q, k, v, g_soft, b)
    assert not torch.isfinite(o_soft).all(), "the unbounded baseline was expected to overflow"
    q, k, v, g_b, b = make_inputs(1, 64, 2, 16, 16, dtype=torch.float32, gate="bounded", **kw)
    o_b, _ = kda_chunk(q, k, v, g_b, b)
    o_ref, _ = kda_recurrent(*(x.double() for x in (q, k, v, g_b, b)))
    assert torch.isfinite(o_b).all()
    close(o_b.double(), o_ref, 1e-4)


def test_fp32_backward_at_the_decay_floor_is_finite_and_exact():
    """Gates pinned near g_min (Γ → −80 inside a chunk, the bound's worst case): fp32 gradients are
    finite and match float64. Regression: K / e^Γ in the forward made the backward form K·e^{−2Γ},
    which overflowed to inf in dg once Γ < −44 (seen as a NaN at step 244 of a recipe run)."""
    q, k, v, g, b = make_inputs(1, 80, 2, 16, 8, dtype=torch.float32, seed=10, h_scale=0.5, h_shift=12.0)
    assert g.min() >= -5.0 and g.max() < -4.0  # all channels near the floor: Γ < −64 by a chunk end
    do = torch.randn(1, 80, 2, 8, generator=torch.Generator().manual_seed(11))
    grads = []
    for dt in (torch.float32, F64):
        xs = [x.to(dt).requires_grad_() for x in (q, k, v, g, b)]
        o, _ = kda_chunk(*xs)
        grads.append(torch.autograd.grad(o, xs, do.to(dt)))
    for name, a, ref in zip(["q", "k", "v", "g", "beta"], *grads):
        assert torch.isfinite(a).all(), f"d{name} not finite"
        close(a.double(), ref, 1e-4 * max(1.0, ref.abs().max().item()))


def test_bf16_long_sequence_65536_bounded():
    """bf16 kda_chunk at T = 65,536 with bounded gates: finite, within 3% (relative L2) of fp32."""
    q, k, v, g, b = make_inputs(1, 65536, 2, 16, 16, dtype=torch.float32, seed=9, h_scale=4.0)
    o32, s32 = kda_chunk(q, k, v, g, b, output_final_state=True)
    o16, s16 = kda_chunk(*(x.bfloat16() for x in (q, k, v, g, b)), output_final_state=True)
    assert torch.isfinite(o16.float()).all() and torch.isfinite(s16).all()
    rel_o = ((o16.float() - o32).norm() / o32.norm()).item()
    rel_s = ((s16 - s32).norm() / s32.norm()).item()
    assert rel_o < 3e-2 and rel_s < 3e-2, (rel_o, rel_s)


def test_chunk_backward_memory_is_linear_in_T():
    """Autograd saves O(T·(K+V)) + per-chunk states, not O(T²): doubling T at most ~doubles saved bytes."""
    saved = []
    for T in (512, 1024):
        xs = [x.requires_grad_() for x in make_inputs(1, T, 2, 16, 16, dtype=torch.float32)]
        total = [0]

        def pack(t, total=total):
            total[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            kda_chunk(*xs)
        saved.append(total[0])
    assert saved[1] <= 2.2 * saved[0], saved


def test_chunk_states_equal_the_final_state_of_each_prefix():
    """``return_chunk_states``: the state after every full chunk is what a call ending there returns."""
    torch.manual_seed(0)
    B, T, H, K, C = 2, 53, 2, 8, 16
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
    v, beta = torch.randn(B, T, H, K), torch.rand(B, T, H)
    g = -torch.rand(B, T, H, K) * 0.5
    s0 = torch.randn(B, H, K, K)
    for n in (T, 48, 16, 7):
        _, final, states = kda_chunk(
            q[:, :n],
            k[:, :n],
            v[:, :n],
            g[:, :n],
            beta[:, :n],
            initial_state=s0,
            output_final_state=True,
            chunk_size=C,
            return_chunk_states=True,
        )
        assert states.shape == (n // C, B, H, K, K)
        for j in range(n // C):
            _, want = kda_chunk(
                q[:, : (j + 1) * C],
                k[:, : (j + 1) * C],
                v[:, : (j + 1) * C],
                g[:, : (j + 1) * C],
                beta[:, : (j + 1) * C],
                initial_state=s0,
                output_final_state=True,
                chunk_size=C,
            )
            torch.testing.assert_close(states[j], want, rtol=1e-5, atol=1e-5)
        if n % C == 0 and n:
            torch.testing.assert_close(states[-1], final)
