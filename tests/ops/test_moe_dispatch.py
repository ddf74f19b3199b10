"""Dropless MoE dispatch (ops/moe/dispatch.py) against the dense every-expert reference (ops/moe/naive.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longmoe.ops.moe import (
    PAD_MULTIPLE,
    Layout,
    choose_tiers,
    decode_experts,
    dense_reference,
    dispatch_experts,
    gather_experts,
    gathered_reduction,
    one_token_compiled,
    route,
)
from longmoe.ops.moe.dispatch import MAX_TIERS


def _problem(N, E, k, l, f, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(N, l, generator=g, dtype=dtype)
    logits = torch.randn(N, E, generator=g)
    w_in = torch.randn(E, l, 2 * f, generator=g, dtype=dtype) / l**0.5
    w_out = torch.randn(E, f, l, generator=g, dtype=dtype) / f**0.5
    _, idx, w = route(logits, torch.zeros(E), k)
    return z, idx, w.to(dtype), w_in, w_out


@pytest.mark.parametrize("impl", ["bmm", "grouped_mm"])
@pytest.mark.parametrize("glu", ["swiglu", "geglu"])
def test_dispatch_matches_dense_reference_with_gradients(impl, glu):
    """Forward and all four gradients equal the dense masked reference in fp32 (≤ 1e-5)."""
    z, idx, w, w_in, w_out = _problem(N=96, E=12, k=3, l=16, f=8, seed=1)
    ins = [t.clone().requires_grad_() for t in (z, w, w_in, w_out)]
    ref = [t.clone().requires_grad_() for t in (z, w, w_in, w_out)]
    out = dispatch_experts(ins[0], idx, ins[1], ins[2], ins[3], glu=glu, impl=impl)
    exp = dense_reference(ref[0], idx, ref[1], ref[2], ref[3], glu=glu)
    torch.testing.assert_close(out, exp, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(out)
    ga = torch.autograd.grad(out, ins, dy)
    gb = torch.autograd.grad(exp, ref, dy)
    for name, a, b in zip(("z", "weights", "w_in", "w_out"), ga, gb):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=f"grad {name}")


def test_dispatch_gradcheck_float64():
    """The hand-written backward of the padded-bmm Function passes finite-difference gradcheck."""
    z, idx, w, w_in, w_out = _problem(N=10, E=5, k=2, l=4, f=3, seed=2, dtype=torch.float64)
    args = [t.requires_grad_() for t in (z, w, w_in, w_out)]
    assert torch.autograd.gradcheck(
        lambda a, b, c, d: dispatch_experts(a, idx, b, c, d, glu="geglu"), args, atol=1e-6
    )


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 40), E=st.integers(1, 20), kf=st.floats(0.01, 1.0), seed=st.integers(0, 10_000))
def test_dispatch_property_any_shape_and_skew(N, E, kf, seed):
    """Any token count, expert count, k ≤ E (experts with no tokens included): dispatch == reference."""
    k = max(1, min(E, round(kf * E)))
    z, idx, w, w_in, w_out = _problem(N=N, E=E, k=k, l=8, f=4, seed=seed)
    if seed % 2:  # heavy skew: most tokens pick the same experts
        idx = torch.arange(k).expand(N, k).clone()
    torch.testing.assert_close(
        dispatch_experts(z, idx, w, w_in, w_out),
        dense_reference(z, idx, w, w_in, w_out),
        atol=1e-5,
        rtol=1e-5,
    )


def test_dispatch_is_dropless_under_total_collapse():
    """Every token on the same k experts (capacity would drop most of them): all are still computed."""
    z, _, w, w_in, w_out = _problem(N=64, E=8, k=2, l=8, f=4, seed=3)
    idx = torch.tensor([[0, 1]]).expand(64, 2).contiguous()
    out = dispatch_experts(z, idx, w, w_in, w_out)
    torch.testing.assert_close(out, dense_reference(z, idx, w, w_in, w_out), atol=1e-5, rtol=1e-5)
    assert (out.abs().sum(-1) > 0).all()


@pytest.mark.parametrize("impl", ["bmm", "grouped_mm"])
def test_dispatch_of_no_tokens_is_empty_with_zero_weight_gradients(impl):
    """N = 0 (an expert-parallel rank that receives no rows): an empty output and zero weight gradients."""
    z, idx, w, w_in, w_out = _problem(N=0, E=4, k=1, l=8, f=4, seed=0)
    w_in.requires_grad_(True)
    out = dispatch_experts(z, idx, w, w_in, w_out, impl=impl)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert w_in.grad is not None and not w_in.grad.any()


def test_dispatch_rejects_unknown_impl():
    z, idx, w, w_in, w_out = _problem(N=4, E=2, k=1, l=4, f=2, seed=0)
    with pytest.raises(ValueError, match="impl: expected one of"):
        dispatch_experts(z, idx, w, w_in, w_out, impl="loop")


def test_tiered_layout_with_one_hot_expert_matches_reference_with_gradients():
    """One expert far more loaded than the rest forces extra bmm tiers over gathered weights; results and
    gradients still equal the reference, and every pair has its own padded row."""
    N, E, k = 200, 40, 2
    z, _, w, w_in, w_out = _problem(N=N, E=E, k=k, l=8, f=4, seed=5)
    g = torch.Generator().manual_seed(5)
    idx = torch.stack([torch.zeros(N, dtype=torch.long), torch.randint(1, E, (N,), generator=g)], 1)
    lay = Layout(idx, E)
    assert len(lay.tiers) > 1 and lay.rows < E * 200  # cheaper than padding everyone to the max
    assert lay.row_of_pair.unique().numel() == N * k
    ins = [t.clone().requires_grad_() for t in (z, w, w_in, w_out)]
    ref = [t.clone().requires_grad_() for t in (z, w, w_in, w_out)]
    out = dispatch_experts(ins[0], idx, *ins[1:])
    exp = dense_reference(ref[0], idx, *ref[1:])
    torch.testing.assert_close(out, exp, atol=1e-5, rtol=1e-5)
    dy = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, ins, dy), torch.autograd.grad(exp, ref, dy)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=64))
def test_choose_tiers_covers_the_largest_group(counts):
    """Tier boundaries start at 0, increase in PAD_MULTIPLE steps, and reach the largest group."""
    b = choose_tiers(torch.tensor(counts))
    assert b[0] == 0 and b[-1] >= max(counts) and all(x < y for x, y in zip(b, b[1:]))
    assert all(x % PAD_MULTIPLE == 0 for x in b) and len(b) - 1 <= MAX_TIERS


@pytest.mark.parametrize("glu", ["swiglu", "geglu"])
@pytest.mark.parametrize("N", [1, 4, 17])
def test_gather_experts_matches_dense_reference(glu, N):
    """The static-shape decode path (per-pair gathered weights) equals the dense reference."""
    z, idx, w, w_in, w_out = _problem(N=N, E=12, k=3, l=16, f=8, seed=N)
    torch.testing.assert_close(
        gather_experts(z, idx, w, w_in, w_out, glu),
        dense_reference(z, idx, w, w_in, w_out, glu),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("glu", ["swiglu", "geglu"])
@pytest.mark.parametrize("N", [1, 4, 21])
def test_decode_experts_match_dense_reference(glu, N, dtype, tol):
    """The decode-sized loop over the chosen experts' weight views equals the dense reference
    (one token, a small batch, and 21·3 = 63 pairs, the most the MoE layer sends it)."""
    z, idx, w, w_in, w_out = _problem(N=N, E=12, k=3, l=16, f=8, seed=N, dtype=dtype)
    out = decode_experts(z, idx, w, w_in, w_out, glu)
    ref = dense_reference(z.float(), idx, w.float(), w_in.float(), w_out.float(), glu)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_decode_experts_never_read_an_idle_expert():
    """Experts no pair chose hold NaN weights and the result stays finite and exact: only the chosen
    experts' weights are read (the dense reference reads every expert, and NaN·0 is NaN)."""
    z, _, w, w_in, w_out = _problem(N=5, E=12, k=2, l=16, f=8, seed=3)
    idx = torch.tensor([[3, 7]] * 4 + [[7, 3]])  # every token on the same two experts
    idle = torch.ones(12, dtype=torch.bool)
    idle[[3, 7]] = False
    ref = dense_reference(z, idx, w, w_in, w_out)
    w_in[idle], w_out[idle] = float("nan"), float("nan")
    torch.testing.assert_close(decode_experts(z, idx, w, w_in, w_out, "swiglu"), ref, atol=1e-5, rtol=1e-5)
    assert dense_reference(z, idx, w, w_in, w_out).isnan().any()  # the test can fail


def test_decode_experts_compile_as_one_node():
    """Under torch.compile(fullgraph=True) the custom op is traced without a graph break."""
    z, idx, w, w_in, w_out = _problem(N=1, E=12, k=3, l=16, f=8, seed=5)
    step = torch.compile(lambda z, idx, w: decode_experts(z, idx, w, w_in, w_out, "swiglu") + 1,
                         backend="aot_eager", fullgraph=True)  # fmt: skip
    ref = dense_reference(z, idx, w, w_in, w_out) + 1
    torch.testing.assert_close(step(z, idx, w), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("glu", ["swiglu", "geglu"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gathered_reduction_matches_dense_reference_and_reads_only_chosen_experts(glu, seed):
    """The one-token reduction form (what a compiled CPU step traces) equals the dense reference, with
    every idle expert's weights NaN (so an idle expert read would show)."""
    z, idx, w, w_in, w_out = _problem(N=1, E=12, k=3, l=16, f=8, seed=seed)
    ref = dense_reference(z, idx, w, w_in, w_out, glu)
    idle = torch.ones(12, dtype=torch.bool)
    idle[idx[0]] = False
    w_in[idle], w_out[idle] = float("nan"), float("nan")
    torch.testing.assert_close(gathered_reduction(z, idx, w, w_in, w_out, glu), ref, atol=1e-5, rtol=1e-5)


def _traced_graph_code(fn, *args) -> str:
    """The code of the graph dynamo hands its backend for ``fn(*args)``, run once."""
    codes = []

    def backend(gm, _inputs):
        codes.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    return "\n".join(codes)


@pytest.mark.parametrize("N", [1, 2])
def test_compiled_moe_layer_traces_reductions_for_one_token_and_the_op_for_more(N):
    """A compiled step of one fp32 token on CPU traces the MoE experts as reductions (no custom op); a
    step of two keeps ``decode_experts``. Eager never takes the reduction form."""
    from longmoe.config import FFNConfig
    from longmoe.layers.moe import MoELayer

    torch.manual_seed(0)
    layer = MoELayer(16, FFNConfig(kind="moe", n_experts=8, top_k=2, expert_hidden=8)).eval()
    layer.static_shapes = True  # as LongMoE.set_static_shapes makes it for a compiled step
    x = torch.randn(N, 1, 16)
    with torch.no_grad():
        code = _traced_graph_code(layer, x)
        torch.testing.assert_close(torch.compile(layer, backend="eager")(x), layer(x), atol=1e-5, rtol=1e-5)
    assert ("decode_experts" in code) == (N > 1)
    assert not one_token_compiled(torch.randn(1, 16))  # not while tracing


def test_moe_layer_takes_the_decode_path_only_without_autograd(monkeypatch):
    """No autograd and few pairs: decode_experts; with gradients (training): the differentiable dispatch.
    Both give the same output."""
    from longmoe.config import FFNConfig
    from longmoe.layers import moe as moe_layer

    torch.manual_seed(0)
    layer = moe_layer.MoELayer(16, FFNConfig(kind="moe", n_experts=8, top_k=2, expert_hidden=8)).eval()
    calls = []
    real = moe_layer.decode_experts
    monkeypatch.setattr(moe_layer, "decode_experts", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(1, 3, 16)
    with torch.no_grad():
        fast = layer(x)
    assert calls == [1]
    slow = layer(x.requires_grad_())
    assert calls == [1]  # the grad path did not take it
    torch.testing.assert_close(fast, slow.detach(), atol=1e-5, rtol=1e-5)
