"""The model's image hook: ``encode_images`` + ``forward(image_embeds=)`` with caches, chunked
prefill and packing, init, and save/load of a vision model."""

from __future__ import annotations

import pytest
import torch

from longmoe.config import IMAGE_PATCH_TOKEN_ID, FFNConfig, ModelConfig, VisionConfig
from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from tests.helpers.models import nudge_off_init

START, PATCH, END = 9, IMAGE_PATCH_TOKEN_ID, 10  # the fixed special-token ids of a longmoe tokenizer
IMAGE_IDS = (START, PATCH, END)
V = 101


def cfg(encoder: str = "vit", **kw) -> ModelConfig:
    base = dict(
        vocab_size=V, d_model=48, n_layers=4, layer_pattern="LLLM", kda_heads=2, kda_head_dim=12,
        kda_gate_rank=6, mla_heads=2, mla_q_lora_rank=24, mla_kv_lora_rank=12, mla_head_dim=12,
        mla_v_head_dim=8, attn_res_blocks=2, ffn=FFNConfig(dense_hidden=64),
        vision=VisionConfig(patch_size=4, max_image_side=32, encoder=encoder, width=32, depth=2, heads=2),
    )  # fmt: skip
    base.update(kw)
    return ModelConfig(**base)


def model(c: ModelConfig, seed: int = 0) -> LongMoE:
    torch.manual_seed(seed)
    m = LongMoE(c)
    nudge_off_init(m)
    with torch.no_grad():
        if m.attn_res is not None:
            m.attn_res.queries.normal_(0.0, 0.5)
    return m.eval()


def patches(rows: int, cols: int, seed: int, p: int = 4) -> Patches:
    g = torch.Generator().manual_seed(seed)
    return Patches(torch.rand(rows * cols, 3 * p * p, generator=g), rows, cols)


def text(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [t for t in torch.randint(12, V, (n,), generator=g).tolist()]


def prompt(images: list[Patches]) -> list[int]:
    """text, image 0, text, image 1, ..., text."""
    out = text(5, 100)
    for i, p in enumerate(images):
        out += [START] + [PATCH] * p.n + [END] + text(3 + i, 101 + i)
    return out


def greedy(m: LongMoE, logits: torch.Tensor, cache, steps: int) -> torch.Tensor:
    """Greedy continuation (image tokens never sampled): the logits of every step [1, steps, V]."""
    outs = []
    for _ in range(steps):
        last = logits[:, -1].clone()
        last[:, list(IMAGE_IDS)] = float("-inf")
        logits = m(last.argmax(-1, keepdim=True), cache=cache).logits
        outs.append(logits)
    return torch.cat(outs, 1)


@pytest.mark.parametrize("encoder", ["linear", "vit", "conv"])
@pytest.mark.parametrize("splits", [(7, 20, 100), (1, 2, 3, 50, 100), (30, 31, 32, 100)])
def test_images_in_chunked_prefill_decode_like_one_forward(encoder, splits):
    """A prompt with two images (3×5 and 4×2 patches) prefilled in chunks that cut the image spans
    (image_embeds sliced by the patch tokens of each chunk), then greedy decode: the same logits as one
    forward over the prompt followed by the same decode (fp32, 1e-5)."""
    m = model(cfg(encoder))
    imgs = [patches(3, 5, 1), patches(4, 2, 2)]
    x = torch.tensor([prompt(imgs)])  # [1, T]
    T = x.shape[1]
    with torch.no_grad():
        emb = m.encode_images(imgs)  # [23, d]
        assert emb.shape == (23, 48)
        full = m(x, image_embeds=emb, use_cache=True)
        ref = greedy(m, full.logits, full.cache, 6)
        cache, outs, a, used = None, [], 0, 0
        for end in splits:
            end = min(end, T)
            chunk = x[:, a:end]
            n = int((chunk == PATCH).sum())
            out = m(chunk, cache=cache, use_cache=True, image_embeds=emb[used : used + n])
            cache, a, used = out.cache, end, used + n
            outs.append(out.logits)
            if a == T:
                break
        assert used == emb.shape[0]
        assert (torch.cat(outs, 1) - full.logits).abs().max() < 1e-5
        got = greedy(m, outs[-1], cache, 6)
    assert (got - ref).abs().max() < 1e-5


def test_image_embeds_change_logits_after_the_image_only():
    """The image's pixels reach the logits from its first patch on, and never before it (causal)."""
    m = model(cfg("vit"))
    a, b = patches(3, 3, 1), patches(3, 3, 2)
    x = torch.tensor([prompt([a])])
    first = x[0].tolist().index(PATCH)
    with torch.no_grad():
        la = m(x, image_embeds=m.encode_images([a])).logits
        lb = m(x, image_embeds=m.encode_images([b])).logits
    assert torch.equal(la[:, :first], lb[:, :first])
    assert not torch.allclose(la[:, first:], lb[:, first:])


def test_image_order_is_row_major_over_the_batch():
    """Two rows with one image each: embeddings fill row 0's patches first, then row 1's."""
    m = model(cfg("linear"))
    a, b = patches(2, 2, 1), patches(2, 3, 2)
    rows = [prompt([a]), prompt([b])]
    L = max(map(len, rows))
    x = torch.tensor([r + [12] * (L - len(r)) for r in rows])
    with torch.no_grad():
        both = m(x, image_embeds=m.encode_images([a, b])).logits
        ra = m(x[:1], image_embeds=m.encode_images([a])).logits
        rb = m(x[1:], image_embeds=m.encode_images([b])).logits
    assert (both - torch.cat([ra, rb])).abs().max() < 1e-5


def test_packed_documents_with_images_equal_separate_forwards():
    """cu_seqlens packing: two image documents in one row give each document's own logits."""
    m = model(cfg("vit"))
    a, b = patches(2, 3, 1), patches(3, 1, 2)
    da, db = prompt([a]), prompt([b])[:-2]
    x = torch.tensor([da + db])
    cu = torch.tensor([0, len(da), len(da) + len(db)], dtype=torch.int32)
    with torch.no_grad():
        packed = m(x, cu_seqlens=cu, image_embeds=m.encode_images([a, b])).logits
        sa = m(torch.tensor([da]), image_embeds=m.encode_images([a])).logits
        sb = m(torch.tensor([db]), image_embeds=m.encode_images([b])).logits
    assert (packed - torch.cat([sa, sb], 1)).abs().max() < 1e-5


def test_count_mismatch_and_text_only_errors():
    m = model(cfg("linear"))
    p = patches(2, 2, 1)
    x = torch.tensor([prompt([p])])
    emb = m.encode_images([p])
    with pytest.raises(ValueError, match="4 <|image_patch|>"):
        m(x, image_embeds=emb[:3])
    with pytest.raises(ValueError, match=r"expected a tensor \[4, 48\], got None"):
        m(x)
    with pytest.raises(ValueError, match="image_embeds"):
        m(x, image_embeds=emb[:, :10])
    text_only = model(cfg(vision=None))
    with pytest.raises(ValueError, match="no vision encoder"):
        text_only.encode_images([p])
    with pytest.raises(ValueError, match="no vision encoder"):
        text_only(x, image_embeds=emb)
    text_only(x)  # a text-only model reads the patch ids as ordinary tokens, as before


@pytest.mark.parametrize("encoder", ["vit", "conv"])
def test_gradients_reach_the_vision_encoder(encoder):
    m = model(cfg(encoder)).train()
    p = patches(3, 2, 1)
    x = torch.tensor([prompt([p])])
    labels = torch.cat([x[:, 1:], torch.full((1, 1), -100)], 1)
    m(x, labels=labels, image_embeds=m.encode_images([p])).loss.backward()
    for name, q in m.vision.named_parameters():
        assert q.grad is not None and q.grad.abs().sum() > 0, name


def test_conv_patch_sees_its_patch_and_half_a_patch_around_it():
    """A conv patch embedding changes with a pixel inside its window (the patch, P/2 around it, plus
    one pixel per stem convolution) and never with one outside it; a second image in the batch
    (padding the first) changes nothing; the parameter count matches the modules."""
    from longmoe.layers.vision import VisionEncoder

    c = cfg("conv")
    m = model(c)
    P, reach = c.vision.patch_size, c.vision.patch_size // 2 + c.vision.depth
    assert sum(q.numel() for q in m.vision.parameters()) == VisionEncoder.param_count(c.vision, c.d_model)
    p = patches(5, 5, 7)
    with torch.no_grad():
        base = m.encode_images([p])[2 * 5 + 2]  # patch (2, 2): pixels y, x in 8..11
        assert torch.allclose(m.encode_images([p, patches(6, 7, 8)])[: p.n], m.encode_images([p]), atol=1e-6)
        for dist, changes in ((1, True), (reach, True), (reach + 1, False)):
            q = Patches(p.pixels.clone(), 5, 5)
            y, x = 2 * P + 1, 3 * P - 1 + dist  # a pixel `dist` to the right of the patch's last column
            r, cc, py, px = y // P, x // P, y % P, x % P
            q.pixels.view(25, 3, P, P)[r * 5 + cc, :, py, px] += 0.5
            moved = not torch.allclose(m.encode_images([q])[2 * 5 + 2], base, atol=1e-6)
            assert moved == changes, dist


def test_vision_init_and_text_weights_unchanged_by_vision():
    """init_weights initialises the encoder (norms 1, std as the text stack); adding vision does not
    change the text weights a seed gives (text-only checkpoints stay reproducible)."""
    torch.manual_seed(0)
    tv = LongMoE(cfg("vit"))
    torch.manual_seed(0)
    t = LongMoE(cfg(vision=None))
    sd = t.state_dict()
    for k, v in sd.items():
        assert torch.equal(v, tv.state_dict()[k]), k
    assert tv.vision.blocks[0].attn_norm.weight.eq(1).all()
    assert abs(float(tv.vision.patch_proj.weight.detach().std()) - 0.02) < 0.004
    assert abs(float(tv.vision.row_embed.weight.detach().std()) - 0.02) < 0.006
    torch.manual_seed(0)
    cv = LongMoE(cfg("conv")).vision  # convolutions fan-in scaled, biases 0, the rest as above
    w = cv.conv.stem[1].weight
    assert abs(float(w.std()) - (2 / w[0].numel()) ** 0.5) < 0.1 * (2 / w[0].numel()) ** 0.5
    assert cv.conv.patch.bias.eq(0).all() and cv.conv.norm.weight.eq(1).all()
    assert abs(float(cv.out_proj.weight.std()) - 0.02) < 0.004


def test_save_load_round_trip_with_vision(tmp_path):
    m = model(cfg("vit"))
    m.save_pretrained(tmp_path)
    m2 = LongMoE.from_pretrained(tmp_path).eval()
    assert m2.cfg.vision == m.cfg.vision
    p = patches(3, 4, 3)
    x = torch.tensor([prompt([p])])
    with torch.no_grad():
        assert torch.equal(m(x, image_embeds=m.encode_images([p])).logits,
                           m2(x, image_embeds=m2.encode_images([p])).logits)  # fmt: skip


def test_static_shape_decode_after_an_image_prompt_matches_eager():
    """The shape-static (compiled engine) path: prefill with images, then decode without the image-token
    check (a host sync that would break a compiled decode graph), same logits as the eager path."""
    m = model(cfg("vit"))
    p = patches(2, 3, 1)
    x = torch.tensor([prompt([p])])
    with torch.no_grad():
        emb = m.encode_images([p])
        ref = m(x, image_embeds=emb, use_cache=True)
        ref_steps = greedy(m, ref.logits, ref.cache, 4)
        m.set_static_shapes(True)
        cache = m.new_cache(1)
        cache.reserve(64)
        out = m(x, cache=cache, image_embeds=emb)
        got = greedy(m, out.logits, cache, 4)
        m.set_static_shapes(False)
    assert (got - ref_steps).abs().max() < 1e-5
