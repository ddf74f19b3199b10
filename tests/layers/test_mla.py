"""Gated NoPE MLA: absorbed == naive attention against the latent cache; row-padded batches are exact."""

from __future__ import annotations

import pytest
import torch

from longmoe.cache import MLAState, Packing
from longmoe.config import ModelConfig
from longmoe.layers.mla import MLALayer

TOL = 1e-5


def cfg(**kw) -> ModelConfig:
    base = dict(
        vocab_size=64,
        d_model=32,
        n_layers=1,
        layer_pattern="M",
        mla_heads=3,
        mla_q_lora_rank=16,
        mla_kv_lora_rank=8,
        mla_head_dim=12,
        mla_v_head_dim=10,
        attn_res_blocks=1,
    )
    base.update(kw)
    return ModelConfig(**base)


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
@pytest.mark.parametrize("path", ["naive", "absorbed"])
def test_cached_paths_equal_full_forward(split, path):
    """Naive and absorbed attention over the latent cache both reproduce the uncached causal forward."""
    m = layer()
    x = torch.randn(2, 23, 32)
    with torch.no_grad():
        full = m(x)
        out, st = run_cached(m, x, split, path)
    assert (out - full).abs().max() < TOL
    assert st.buf.shape[1] >= 23 and st.buf.shape[2] == 8  # only d_c numbers per cached token


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


def test_packed_documents_do_not_attend_across():
    """The block-diagonal mask: each packed document equals the document alone."""
    m = layer(3)
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
