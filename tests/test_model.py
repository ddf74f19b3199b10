"""LongMoE: causality, exact chunked prefill and decode, batched decode over stacked rows, packing,
save/load, and the loss."""

from __future__ import annotations

import json

import pytest
import torch

from longmoe.cache import Cache
from longmoe.config import ConfigError, FFNConfig, ModelConfig
from longmoe.model import LongMoE
from longmoe.presets import preset
from tests.helpers.models import nudge_off_init

TOL = 1e-4  # fp32, the bound for decode == full forward


def cfg(pattern: str = "LLLM", **kw) -> ModelConfig:
    base = dict(
        vocab_size=101,
        d_model=48,
        n_layers=4,
        layer_pattern=pattern,
        kda_heads=2,
        kda_head_dim=12,
        kda_gate_rank=6,
        mla_heads=2,
        mla_q_lora_rank=24,
        mla_kv_lora_rank=12,
        mla_head_dim=12,
        mla_v_head_dim=8,
        attn_res_blocks=2,
        ffn=FFNConfig(dense_hidden=64),
    )
    base.update(kw)
    return ModelConfig(**base)


def model(c: ModelConfig, seed: int = 0) -> LongMoE:
    """A model whose weights are moved off init (non-uniform AttnRes mixing, non-zero gate scales)."""
    torch.manual_seed(seed)
    m = LongMoE(c)
    nudge_off_init(m)
    with torch.no_grad():
        if m.attn_res is not None:
            m.attn_res.queries.normal_(0.0, 0.5)
    return m.eval()


def ids(B: int, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 101, (B, T), generator=torch.Generator().manual_seed(seed))


def decode_all(m: LongMoE, x: torch.Tensor) -> torch.Tensor:
    cache = m.new_cache(x.shape[0])
    return torch.cat([m(x[:, t : t + 1], cache=cache).logits for t in range(x.shape[1])], 1)


@pytest.mark.parametrize("pattern", ["L", "M", "LLLM"])
def test_decode_equals_full_forward_every_position(pattern):
    """One-token decode from an empty cache matches the full forward at every position (fp32, 1e-4)."""
    m = model(cfg(pattern))
    x = ids(2, 24)
    with torch.no_grad():
        full = m(x).logits
        assert (decode_all(m, x) - full).abs().max() < TOL
        m.set_mla_decode("naive")
        assert (decode_all(m, x) - full).abs().max() < TOL


@pytest.mark.parametrize("splits", [(1, 39), (16, 24), (5, 7, 11, 17), (33, 7)])
def test_chunked_prefill_equals_full_forward(splits):
    """Prefill in chunks of any size, then decode, equals one full forward."""
    m = model(cfg("LLLM"))
    x = ids(2, 40, 1)
    with torch.no_grad():
        full = m(x).logits
        cache, outs, a = None, [], 0
        for s in splits:
            out = m(x[:, a : a + s], cache=cache, use_cache=True)
            cache, a = out.cache, a + s
            outs.append(out.logits)
    assert cache.seq_lens.tolist() == [40, 40]
    assert (torch.cat(outs, 1) - full).abs().max() < TOL


@pytest.mark.parametrize("keep", [1, 5, 40])
def test_logits_to_keep_gives_the_last_positions_of_the_full_forward(keep):
    """A prefill's head on the last ``keep`` positions only: the same numbers as those rows of the full
    logits, and the same cache after it (the next call's logits agree too)."""
    m = model(cfg("LLLM"))
    x = ids(2, 40, 3)
    with torch.no_grad():
        full = m(x, use_cache=True)
        part = m(x, use_cache=True, logits_to_keep=keep)
        assert part.logits.shape == (2, keep, full.logits.shape[-1])
        assert (part.logits - full.logits[:, -keep:]).abs().max() < TOL
        nxt = ids(2, 1, 4)
        assert (m(nxt, cache=part.cache).logits - m(nxt, cache=full.cache).logits).abs().max() < TOL


def test_causality():
    """Changing token t never changes the logits before t."""
    m = model(cfg("LLLM"))
    x = ids(1, 30, 2)
    y = x.clone()
    y[0, 17] = (y[0, 17] + 1) % 101
    with torch.no_grad():
        a, b = m(x).logits, m(y).logits
    assert torch.equal(a[:, :17], b[:, :17])
    assert not torch.allclose(a[:, 17:], b[:, 17:])


def test_stacked_rows_decode_like_each_row_alone():
    """Cache.stack of rows with different lengths, one batched decode step, split: same as each alone."""
    m = model(cfg("LLLM"))
    lens = [13, 3, 25]
    seqs = [ids(1, n + 4, 10 + i) for i, n in enumerate(lens)]
    with torch.no_grad():
        rows = []
        for s, n in zip(seqs, lens, strict=True):
            c = m.new_cache(1)
            m(s[:, :n], cache=c)
            rows.append(c)
        alone = [
            m(s[:, n : n + 1], cache=c.clone()).logits[0, 0] for s, n, c in zip(seqs, lens, rows, strict=True)
        ]
        batch = Cache.stack(rows)
        assert batch.seq_lens.tolist() == lens
        nxt = torch.cat([s[:, n : n + 1] for s, n in zip(seqs, lens, strict=True)])
        for step in range(3):  # several steps: padded rows keep growing at their own positions
            out = m(nxt, cache=batch).logits[:, 0]
            if step == 0:
                for i in range(3):
                    assert (out[i] - alone[i]).abs().max() < TOL
            nxt = torch.cat([s[:, n + step + 1 : n + step + 2] for s, n in zip(seqs, lens, strict=True)])
        split = batch.split()
        assert [c.seq_lens.item() for c in split] == [n + 3 for n in lens]
        for s, n, c in zip(seqs, lens, split, strict=True):  # rows continue alone after the split
            full = m(s).logits[0, -1]
            assert (m(s[:, n + 3 :], cache=c).logits[0, -1] - full).abs().max() < TOL


def test_packed_documents_do_not_leak():
    """cu_seqlens: every document's logits equal the document alone, and editing one leaves others."""
    m = model(cfg("LLLM"))
    x = ids(1, 45, 3)
    cu = torch.tensor([0, 9, 10, 31, 45])
    docs = list(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True))
    with torch.no_grad():
        packed = m(x, cu_seqlens=cu).logits
        alone = torch.cat([m(x[:, a:b]).logits for a, b in docs], 1)
        assert (packed - alone).abs().max() < TOL
        y = x.clone()
        y[0, 3] = (y[0, 3] + 1) % 101  # inside document 0
        packed2 = m(y, cu_seqlens=cu).logits
    assert torch.equal(packed[:, 9:], packed2[:, 9:])


def test_plain_residual_switch():
    """attn_res=False: no pseudo-queries, still exact decode."""
    m = model(cfg("LLLM", attn_res=False))
    assert m.attn_res is None
    x = ids(1, 20, 4)
    with torch.no_grad():
        assert (decode_all(m, x) - m(x).logits).abs().max() < TOL


def test_loss_is_shifted_ce_with_ignore_index():
    """loss == mean CE over positions whose label is not -100 (labels are pre-shifted)."""
    m = model(cfg("LLLM"))
    x = ids(2, 12, 5)
    labels = x.roll(-1, 1)
    labels[:, -1] = -100
    labels[0, :4] = -100
    out = m(x, labels=labels)
    keep = labels != -100
    ref = torch.nn.functional.cross_entropy(out.logits[keep], labels[keep])
    assert abs(out.ce_loss.item() - ref.item()) < 1e-5
    assert out.loss.item() == pytest.approx(out.ce_loss.item() + out.aux_loss.item())
    out.loss.backward()
    assert all(p.grad is not None for p in m.parameters())


def test_init_loss_near_log_vocab():
    """The documented init starts at ~ln(vocab) loss (no exploding logits)."""
    torch.manual_seed(0)
    c = cfg("LLLM")
    m = LongMoE(c)
    x, y = ids(2, 32, 6), ids(2, 32, 7)  # labels independent of the inputs
    loss = m(x, labels=y).loss.item()
    assert abs(loss - torch.log(torch.tensor(101.0)).item()) < 0.1


def test_save_load_round_trip(tmp_path):
    """save_pretrained/from_pretrained (config.json + model.safetensors) gives identical logits."""
    m = model(cfg("LLLM"))
    m.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
    m2 = LongMoE.from_pretrained(tmp_path).eval()
    x = ids(2, 16, 7)
    with torch.no_grad():
        assert torch.equal(m(x).logits, m2(x).logits)


def test_from_pretrained_errors(tmp_path):
    """Missing files, a config that does not match the weights, and bad config fields are named."""
    with pytest.raises(FileNotFoundError, match="not found"):
        LongMoE.from_pretrained(tmp_path / "nope")
    m = model(cfg("LLLM"))
    m.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "w.bak")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        LongMoE.from_pretrained(tmp_path)
    (tmp_path / "w.bak").rename(tmp_path / "model.safetensors")
    d = json.loads((tmp_path / "config.json").read_text())
    d["d_model"] = 64
    d["kda_head_dim"] = 12
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="shape mismatch"):
        LongMoE.from_pretrained(tmp_path)
    d["d_modle"] = 3
    (tmp_path / "config.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="d_modle"):
        LongMoE.from_pretrained(tmp_path)


def test_bad_inputs_raise():
    """cu_seqlens with a cache, or offsets that do not cover T, are rejected with a named argument."""
    m = model(cfg("LLLM"))
    x = ids(1, 10)
    with pytest.raises(ValueError, match="cu_seqlens"):
        m(x, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        m(x, cu_seqlens=torch.tensor([0, 10]), use_cache=True)
    with pytest.raises(ValueError, match="cache"):
        m(x, cache=m.new_cache(2))
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="logits_to_keep"):
            m(x, logits_to_keep=bad)
    with pytest.raises(ValueError, match="logits_to_keep"):
        m(x, labels=x, logits_to_keep=1)


def test_tiny_moe_model_trains_and_decodes():
    """The tiny preset (MoE FFN): aux loss wired in, moe_layers found, decode == full forward."""
    c = preset("tiny").replace(vocab_size=101, n_layers=4, attn_res_blocks=2)
    torch.manual_seed(0)
    m = LongMoE(c)
    assert len(m.moe_layers()) == c.n_layers - c.ffn.first_k_dense
    x = ids(1, 16, 8)
    out = m(x, labels=x)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.aux_loss is not None
    m.eval()
    with torch.no_grad():
        assert (decode_all(m, x) - m(x).logits).abs().max() < TOL


def test_bf16_model_runs_with_fp32_state():
    """dtype=bfloat16: parameters in bf16, KDA states stay fp32 in the cache, logits finite."""
    m = LongMoE(cfg("LLLM", dtype="bfloat16")).eval()
    assert m.embed.weight.dtype == torch.bfloat16
    c = m.new_cache(1)
    with torch.no_grad():
        out = m(ids(1, 9), cache=c)
    assert c.layers[0].state.dtype == torch.float32 and torch.isfinite(out.logits.float()).all()
    assert c.nbytes() > 0


def test_shared_key_cache_reuse_truncate_and_stack():
    """A model whose MLA layers have a shared key part (mla_shared_key_dim): the cache's bytes count it,
    and prefix segments, truncation and stacked rows of different lengths all continue exactly."""
    c = cfg("M", mla_shared_key_dim=5)
    m = model(c)
    x = ids(2, 14, 3)
    with torch.no_grad():
        full = m(x).logits
        cache = m.new_cache(1)
        m(x[:1, :6], cache=cache)
        first = cache.segment(0, 6)
        m(x[:1, 6:10], cache=cache)
        assert cache.nbytes() == 10 * c.n_layers * (12 + 5) * 4  # latent d_c + shared key part, fp32
        assert cache.spec().per_token == c.n_layers * (12 + 5) * 4
        row = Cache.from_segments([first, cache.segment(6, 10)], 10, "cpu")  # prefix reuse
        assert (m(x[:1, 10:12], cache=row).logits - full[:1, 10:12]).abs().max() < TOL
        cache.truncate(7)  # forget tokens 7..9, then feed them again
        assert (m(x[:1, 7:10], cache=cache).logits - full[:1, 7:10]).abs().max() < TOL
        other = m.new_cache(1)
        m(x[1:, :3], cache=other)
        both = Cache.stack([cache, other])  # rows at 10 and 3 tokens
        step = m(torch.stack([x[0, 10:11], x[1, 3:4]]), cache=both).logits
    assert (step[0] - full[0, 10:11]).abs().max() < TOL
    assert (step[1] - full[1, 3:4]).abs().max() < TOL
