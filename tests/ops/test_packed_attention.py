"""Attention over packed documents (ops/attention/packed.py) == the full [T, T] block-diagonal mask
(ops/attention/naive.py), values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longmoe.ops.attention import packed_causal_attention, packed_causal_attention_reference


def _qkv(T: int, dtype=torch.float32, B: int = 1, H: int = 2, D: int = 16, Dv: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda d: torch.randn(B, H, T, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    return mk(D), mk(D), mk(Dv)


LAYOUTS = {
    "one document": [0, 300],
    "many short documents": [0, 1, 2, 5, 9, 30, 31, 64, 100, 101, 180, 250, 300],
    "documents longer than a tile": [0, 37, 290, 300],
    "boundaries on tile edges": [0, 64, 128, 192, 300],
    "empty documents": [0, 0, 50, 50, 300],
}


@pytest.mark.parametrize(
    "tile, min_doc_tokens",
    [(64, 10**9), (100, 10**9), (512, 10**9), (256, 1)],
    ids=["tiles64", "tiles100", "tiles512", "per-doc"],
)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_the_masked_full_attention(layout, tile, min_doc_tokens):
    """Both paths (tiles; one causal call per document) on every layout."""
    cu = torch.tensor(LAYOUTS[layout])
    q, k, v = _qkv(300, B=2)
    out = packed_causal_attention(q, k, v, cu, tile=tile, min_doc_tokens=min_doc_tokens)
    ref = packed_causal_attention_reference(q, k, v, cu)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    dout = torch.randn_like(out)
    g = torch.autograd.grad(out, (q, k, v), dout)
    g_ref = torch.autograd.grad(ref, (q, k, v), dout)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("min_doc_tokens", [1, 10**9])
def test_documents_do_not_see_each_other_and_one_document_is_plain_causal(min_doc_tokens):
    """Changing a document's keys/values leaves every other document's output unchanged."""
    cu = torch.tensor([0, 70, 200, 256])
    q, k, v = (t.detach() for t in _qkv(256))
    out = packed_causal_attention(q, k, v, cu, tile=64, min_doc_tokens=min_doc_tokens)
    k2, v2 = k.clone(), v.clone()
    k2[..., 70:200, :] += 5.0
    v2[..., 70:200, :] -= 3.0
    out2 = packed_causal_attention(q, k2, v2, cu, tile=64, min_doc_tokens=min_doc_tokens)
    assert torch.equal(out[..., :70, :], out2[..., :70, :]) and torch.equal(
        out[..., 200:, :], out2[..., 200:, :]
    )
    assert not torch.allclose(out[..., 70:200, :], out2[..., 70:200, :])
    whole = packed_causal_attention(q, k, v, torch.tensor([0, 256]), tile=64)
    torch.testing.assert_close(whole, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_bf16_and_extreme_scores_stay_close_to_float64():
    cu = torch.tensor([0, 40, 41, 200, 333, 512])
    q, k, v = (t.detach() for t in _qkv(512, dtype=torch.float64))
    q = q * 30.0  # near one-hot softmax rows
    ref = packed_causal_attention_reference(q, k, v, cu)
    for min_doc_tokens in (1, 10**9):
        out = packed_causal_attention(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), cu, tile=128, min_doc_tokens=min_doc_tokens
        )
        assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
        assert (out.double() - ref).abs().max() < 0.1 * ref.abs().max()


def test_bad_offsets_are_rejected():
    q, k, v = _qkv(32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        packed_causal_attention(q, k, v, torch.tensor([0, 20, 10, 32]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        packed_causal_attention(q, k, v, torch.tensor([0, 31]))
    with pytest.raises(ValueError, match="tile"):
        packed_causal_attention(q, k, v, torch.tensor([0, 32]), tile=0)
