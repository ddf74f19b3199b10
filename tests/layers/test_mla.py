"""Gated NoPE MLA: absorbed == naive attention against the latent cache; row-padded batches are exact."""

from __future__ import annotations

import pytest
import torch

from longmoe.cache import MLAState, Packing
from longmoe.config import ModelConfig
from longmoe.layers import mla
from longmoe.layers.mla import MLALayer
from tests.helpers.models import small_cfg

TOL = 1e-5


def cfg(**kw) -> ModelConfig:
    mla = dict(mla_heads=3, mla_q_lora_rank=16, mla_kv_lora_rank=8, mla_head_dim=12, mla_v_head_dim=10)
    return small_cfg("M", **{**mla, **kw})


def layer(seed: int = 0) -> MLALayer:
    torch.manual_seed(seed)
    m = MLALayer(cfg())
    m.init_weights(0.3, 0.3)
    return m.eval()


def run_cached(m: MLALayer, x: torch.Tensor, split: int, path: str) -> tuple[torch.Tensor, MLAState]:
    m.decode_path = path
    st = m.new_state(x.shape[0], x.device, x.dtype)
    lens = torch.zeros(x.shape[0], dtype=torch.long)
    outs = []
    for a in range(0, x.shape[1], split):
        xs = x[:, a : a + split]
        outs.append(m(xs, st, lens))
        lens = lens + xs.shape[1]
    return torch.cat(outs, 1), st


def test_param_count_formula_matches_module():
    """MLALayer.param_count (used by `longmoe inspect`) equals the real parameter count."""
    c = cfg()
    assert MLALayer.param_count(c) == sum(p.numel() for p in MLALayer(c).parameters())


@pytest.mark.parametrize("split", [1, 4, 11])
@pytest.mark.parametrize("path", ["naive", "absorbed", "auto"])
def test_cached_paths_equal_full_forward(split, path):
    """Naive, absorbed and cost-chosen attention over the latent cache all reproduce the uncached
    causal forward."""
    m = layer()
    x = torch.randn(2, 23, 32)
    with torch.no_grad():
        full = m(x)
        out, st = run_cached(m, x, split, path)
    assert (out - full).abs().max() < TOL
    assert st.buf.shape[1] >= 23 and st.buf.shape[2] == 8  # only d_c numbers per cached token


def test_auto_path_absorbs_decode_and_expands_long_chunks():
    """The cost rule: absorbed while few queries share the expansion of the cache rows, naive once a
    chunk is long enough that the per-pair saving pays for expanding every row to per-head K and V."""
    m = layer()  # d_c 8 against Dk + Dv = 22: a latent pair (2·8) is cheaper at any T
    assert m.cached_path(1) == m.cached_path(4096) == "absorbed"
    big = MLALayer(small_cfg("M", mla_heads=2, mla_kv_lora_rank=256, mla_head_dim=128, mla_v_head_dim=128,
                             mla_shared_key_dim=64))  # fmt: skip  # the 0.3B benchmark model's MLA shapes
    assert big.cached_path(1) == big.cached_path(128) == "absorbed"
    assert big.cached_path(256) == big.cached_path(2048) == "naive"
    big.decode_path = "absorbed"
    assert big.cached_path(2048) == "absorbed"  # a forced path is kept


def test_absorbed_equals_naive_decode():
    """The two decode paths agree step by step (fp32, 1e-5)."""
    m = layer(1)
    x = torch.randn(3, 17, 32)
    with torch.no_grad():
        a, _ = run_cached(m, x, 1, "absorbed")
        n, _ = run_cached(m, x, 1, "naive")
    assert (a - n).abs().max() < TOL


@pytest.mark.parametrize("path", ["naive", "absorbed"])
def test_rows_of_different_lengths_decode_exactly(path):
    """A padded batch whose rows have different cached lengths gives each row's own result."""
    m = layer(2)
    m.decode_path = path
    x = torch.randn(2, 15, 32)
    with torch.no_grad():
        full = m(x)
        lens = torch.tensor([9, 4])
        st = MLAState(torch.zeros(2, 9, 8))
        for b, n in enumerate(lens.tolist()):  # write each row's own prefix into the padded buffer
            sb = m.new_state(1, x.device, x.dtype)
            m(x[b : b + 1, :n], sb, torch.zeros(1, dtype=torch.long))
            st.buf[b, :n] = sb.buf[0, :n]
        nxt = torch.stack([x[0, 9:11], x[1, 4:6]])  # two more tokens per row
        out = m(nxt, st, lens)
    assert (out[0] - full[0, 9:11]).abs().max() < TOL
    assert (out[1] - full[1, 4:6]).abs().max() < TOL


@pytest.mark.parametrize("path", ["naive", "absorbed"])
@pytest.mark.parametrize(("T", "masked_max"), [(1, 0), (1, 16384), (90, 16384)])
def test_rows_of_different_lengths_per_row_or_masked(path, T, masked_max, monkeypatch):
    """Rows at different cached lengths: the per-row fused calls (a long chunk, or a decode step over a
    long cache) and the one masked call (a short decode step) both give each row's own result."""
    monkeypatch.setattr(mla, "MASKED_MAX_ROWS", masked_max)
    m = layer(5)
    m.decode_path = path
    x = torch.randn(2, 130, 32)
    lens = [30, 7]
    with torch.no_grad():
        full = m(x)
        st = MLAState(torch.zeros(2, 30, 8))
        for b, n in enumerate(lens):
            sb = m.new_state(1, x.device, x.dtype)
            m(x[b : b + 1, :n], sb, torch.zeros(1, dtype=torch.long))
            st.buf[b, :n] = sb.buf[0, :n]
        out = m(torch.stack([x[b, n : n + T] for b, n in enumerate(lens)]), st, torch.tensor(lens))
    for b, n in enumerate(lens):
        assert (out[b] - full[b, n : n + T]).abs().max() < TOL


@pytest.mark.parametrize("kind", ["plain", "shared key", "log-length scaled"])
def test_packed_documents_do_not_attend_across(kind):
    """The block-diagonal mask: each packed document equals the document alone (with a shared key part;
    with log-length scaling, whose n counts the keys inside the query's own document)."""
    m = {"plain": layer, "shared key": shared_layer, "log-length scaled": logn_layer}[kind](3)
    x = torch.randn(1, 20, 32)
    cu = torch.tensor([0, 6, 7, 20])
    with torch.no_grad():
        packed = m(x, packing=Packing(cu))
        alone = torch.cat([m(x[:, a:b]) for a, b in ((0, 6), (6, 7), (7, 20))], 1)
    assert (packed - alone).abs().max() < TOL


def test_output_gate_scales_heads():
    """The sigmoid gate sits before o_proj: a huge negative gate bias silences the layer."""
    m = layer(4)
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        H, Dv = m.H, m.Dv
        m.in_proj.weight[-H * Dv :] = 0.0
        m.in_proj.weight[-H * Dv :, 0] = -1e4  # gate logits ≈ -1e4 * x[..., 0]
        x[..., 0] = 1.0
        assert m(x).abs().max() < 1e-6


# ---------------------------------------------------------------- shared key part (mla_shared_key_dim)
D_R = 6  # shared key numbers per token (Kimi-Linear's k_pe width, here small)


def shared_layer(seed: int = 0, **kw) -> MLALayer:
    torch.manual_seed(seed)
    m = MLALayer(cfg(mla_shared_key_dim=D_R, **kw))
    m.init_weights(0.3, 0.3)
    with torch.no_grad():  # a non-trivial latent norm, so "normalise the latent only" is tested
        m.kv_norm.weight.copy_(1.0 + 0.3 * torch.randn_like(m.kv_norm.weight))
    return m.eval()


def reference_shared_key(m: MLALayer, x: torch.Tensor) -> torch.Tensor:
    """The math written out from the weights: kv down = [latent | k_r], only the latent normalised;
    per head score = q_h·k_h(latent) + q_r,h·k_r (k_r the same for every head), scale (Dq + d_r)^-1/2;
    with log-length scaling, query t's scores times s·ln(t + 1) (it sees t + 1 keys)."""
    B, T, _ = x.shape
    H, Dq, Dv, dc, dr = m.H, m.Dq, m.Dv, m.d_c, m.d_r
    q_down, kv_down, gate = (x @ m.in_proj.weight.t()).split(m.splits, dim=-1)
    q = m.q_up(m.q_norm(q_down)) if m.q_up is not None else q_down
    q = q.view(B, T, H, Dq + dr)
    latent, k_r = kv_down[..., :dc], kv_down[..., dc:]
    latent = m.kv_norm(latent)
    w_k, w_v = m.kv_up.weight.split((H * Dq, H * Dv))
    k_lat = (latent @ w_k.t()).view(B, T, H, Dq)
    v = (latent @ w_v.t()).view(B, T, H, Dv)
    scores = torch.einsum("bthd,bshd->bhts", q[..., :Dq], k_lat) + torch.einsum(
        "bthr,bsr->bhts", q[..., Dq:], k_r
    )
    scores = scores * (Dq + dr) ** -0.5
    if m.logn_scale:
        scores = scores * (m.logn_scale * torch.log(torch.arange(1, T + 1, dtype=x.dtype)))[:, None]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    p = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    o = torch.einsum("bhts,bshv->bthv", p, v)
    if m.splits[2]:
        o = o * torch.sigmoid(gate).view(B, T, H, Dv)
    return m.o_proj(o.reshape(B, T, H * Dv))


@pytest.mark.parametrize("q_rank", [16, 0])
def test_shared_key_matches_the_written_out_math(q_rank):
    """Full forward with a shared key part equals the reference above (low-rank and full-rank q)."""
    m = shared_layer(5, mla_q_lora_rank=q_rank)
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        assert (m(x) - reference_shared_key(m, x)).abs().max() < TOL
    c = cfg(mla_shared_key_dim=D_R, mla_q_lora_rank=q_rank)
    assert MLALayer.param_count(c) == sum(p.numel() for p in MLALayer(c).parameters())


def test_shared_key_part_is_live():
    """Zeroing the k_r rows of the kv down projection changes the output (the part is really used)."""
    m = shared_layer(6)
    x = torch.randn(1, 9, 32)
    lo = m.splits[0] + m.d_c
    with torch.no_grad():
        ref = m(x)
        m.in_proj.weight[lo : lo + D_R] = 0.0
        assert (m(x) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("split", [1, 4, 11])
@pytest.mark.parametrize("path", ["naive", "absorbed"])
def test_shared_key_cached_paths_equal_full_forward(split, path):
    """Prefill + decode through the cache (both attention paths) == the uncached forward, and the cache
    holds d_c + d_r numbers per token: the latent, then the un-normalised shared key part."""
    m = shared_layer(7)
    x = torch.randn(2, 23, 32)
    with torch.no_grad():
        full = m(x)
        out, st = run_cached(m, x, split, path)
        kv_down = (x @ m.in_proj.weight.t()).split(m.splits, dim=-1)[1]
    assert (out - full).abs().max() < TOL
    assert st.buf.shape[2] == 8 + D_R
    assert st.spec().per_token == (8 + D_R) * 4
    torch.testing.assert_close(st.buf[:, :23, 8:], kv_down[..., 8:])  # k_r cached as projected (no norm)
    assert st.nbytes(torch.tensor([23, 23])) == 2 * 23 * (8 + D_R) * 4


@pytest.mark.parametrize("kind", ["shared key", "log-length scaled"])
def test_static_shapes_and_padded_rows(kind):
    """The compiled-step layout (whole buffer + per-row mask) and rows of different cached lengths, both
    paths, a shared key part; with log-length scaling each row's queries are scaled by their own
    positions (from the seq_lens tensor)."""
    m = {"shared key": shared_layer, "log-length scaled": logn_layer}[kind](8)
    x = torch.randn(2, 15, 32)
    with torch.no_grad():
        full = m(x)
        for static in (False, True):
            for path in ("naive", "absorbed"):
                m.decode_path, m.static_shapes = path, static
                lens = torch.tensor([9, 4])
                st = MLAState(torch.zeros(2, 64 if static else 9, 8 + D_R))
                for b, n in enumerate(lens.tolist()):
                    sb = m.new_state(1, x.device, x.dtype)
                    sb.reserve(64)
                    m(x[b : b + 1, :n], sb, torch.zeros(1, dtype=torch.long))
                    st.buf[b, :n] = sb.buf[0, :n]
                out = m(torch.stack([x[0, 9:11], x[1, 4:6]]), st, lens)
                assert (out[0] - full[0, 9:11]).abs().max() < TOL, (static, path)
                assert (out[1] - full[1, 4:6]).abs().max() < TOL, (static, path)
        m.static_shapes = False


def test_default_has_no_shared_key_part():
    """mla_shared_key_dim = 0 (the default): the cache row is the latent alone and shapes are today's."""
    m = layer()
    assert m.d_r == 0 and m.Dk == m.Dq and m.scale == 12**-0.5
    assert m.in_proj.weight.shape[0] == 16 + 8 + 3 * 10  # q down | kv down (d_c) | gate
    assert m.new_state(1, torch.device("cpu"), torch.float32).buf.shape[2] == 8


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("split", [1, 4, 11])
def test_absorbed_head_folding_equals_per_head_attention(monkeypatch, split, static):
    """Absorbed attention with the heads folded into one query axis (decode-sized calls) equals the
    per-head view (long chunks), with and without the static-shape mask, rows of different lengths."""
    from longmoe.layers import mla

    m = layer(4)
    m.static_shapes = static
    x = torch.randn(2, 19, 32)
    lens0 = torch.tensor([0, 5])
    outs = {}
    for fold in (0, 10**9):
        monkeypatch.setattr(mla, "FOLD_MAX_QUERIES", fold)
        m.decode_path = "absorbed"
        st, lens, got = m.new_state(2, x.device, x.dtype), lens0.clone(), []
        st.ensure_capacity(64)
        with torch.no_grad():
            for a in range(0, 19, split):
                got.append(m(x[:, a : a + split], st, lens))
                lens = lens + got[-1].shape[1]
        outs[fold] = torch.cat(got, 1)
    assert (outs[0] - outs[10**9]).abs().max() < TOL


# ---------------------------------------------------------------- log-length scaling (mla_logn_scale)
LOGN = 0.7  # s: query t's logits times s·ln(t + 1)


def logn_layer(seed: int = 0, **kw) -> MLALayer:
    return shared_layer(seed, mla_logn_scale=LOGN, **kw)


def test_logn_scaling_matches_the_written_out_math_and_is_live():
    """Full forward with the scaling equals the reference (query t's logits times s·ln(t + 1)), and
    differs from the same weights without it; off (0.0, the default) leaves the query untouched."""
    m = logn_layer(11)
    x = torch.randn(2, 13, 32)
    plain = shared_layer(11)
    with torch.no_grad():
        assert (m(x) - reference_shared_key(m, x)).abs().max() < TOL
        assert (m(x) - plain(x)).abs().max() > 1e-3
    q = torch.randn(1, 3, 5, 4)
    assert plain.logn_scale == 0.0 and plain.length_scaled(q, torch.arange(5)) is q


@pytest.mark.parametrize("split", [1, 4, 11])
@pytest.mark.parametrize("path", ["naive", "absorbed", "auto"])
def test_logn_scaling_cached_paths_equal_full_forward(split, path):
    """Prefill in chunks and decode through the cache, naive and absorbed, scale each query by its own
    position (cached length + offset): the same outputs as the uncached forward."""
    m = logn_layer(12)
    x = torch.randn(2, 23, 32)
    with torch.no_grad():
        out, _ = run_cached(m, x, split, path)
        assert (out - m(x)).abs().max() < TOL


def test_logn_scaling_split_long_prefix_path_equals_full_forward(monkeypatch):
    """The absorbed path's split of a long cached prefix over threads (``ops/attention/latent.py``, cut
    into pieces from ``MIN_SPLIT_ROWS`` rows; here from 3) takes the scaled query: decode == forward."""
    from longmoe.ops.attention import latent

    monkeypatch.setattr(latent, "MIN_SPLIT_ROWS", 3)
    assert latent.split_count(20, 6) > 1, "the decode steps below run the split path"
    m = logn_layer(13)
    x = torch.randn(1, 29, 32)
    with torch.no_grad():
        out, _ = run_cached(m, x, 1, "absorbed")
        assert (out - m(x)).abs().max() < TOL


@pytest.mark.parametrize("scaled", [False, True])
def test_attend_at_equals_forward_at_those_positions(scaled):
    """``attend_at`` (a few queries against every cache row) gives the forward's output at those positions;
    its weights are a distribution over the rows up to each position and 0 after it."""
    m = logn_layer(16) if scaled else shared_layer(16)
    x = torch.randn(2, 17, 32)
    pos = torch.tensor([[0, 5, 16], [3, 3, 9]])
    with torch.no_grad():
        full = m(x)
        _, rows, _ = m.project(x)
        got, w = m.attend_at(x.gather(1, pos[..., None].expand(-1, -1, 32)), rows, pos)
    for b in range(2):
        assert (got[b] - full[b, pos[b]]).abs().max() < TOL
    torch.testing.assert_close(w.sum(-1), torch.ones(2, m.H, 3))
    after = torch.arange(17)[None, None, :] > pos[:, :, None]  # [B, n, S]
    assert w.masked_select(after[:, None].expand_as(w)).abs().max() == 0
    with pytest.raises(ValueError, match="positions"):
        m.attend_at(x[:, :3], rows[:, :10], pos)
