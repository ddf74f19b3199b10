"""The engine with images in prompts (``serve/prompt_images.py``): greedy tokens through chunked
prefill that cuts the image spans equal one full forward + greedy decode; requests with and without
images batched together equal each alone; prefix reuse keys include the pixels; speculative decoding
with a text-only or a vision draft keeps the target's output; image tokens are never generated;
sessions carry their images; refusals name the field."""

from __future__ import annotations

import pytest
import torch

from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from longmoe.serve.compiled import CompiledSteps
from longmoe.serve.engine import Engine
from longmoe.serve.errors import EngineError
from longmoe.serve.prefix_store import SnapshotStore
from longmoe.serve.prompt_images import PromptImages, pixel_digest
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.speculative import truncated_draft
from tests.helpers.models import VISION, tiny_model, tiny_vision_model

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
P = VISION.patch_size


@pytest.fixture(scope="module")
def vmodel() -> LongMoE:
    return tiny_vision_model()


def image(rows: int, cols: int, seed: int) -> Patches:
    g = torch.Generator().manual_seed(seed)
    return Patches(torch.rand(rows * cols, 3 * P * P, generator=g), rows, cols)


@pytest.fixture(scope="module")
def engine(make_engine):
    """``engine(model, **fields)``: the module's engines, without the prefix cache unless asked."""
    return lambda model, **kw: make_engine(model, **{"prefix_cache": False, **kw})


def chat_ids(e: Engine, text: str, images: list[Patches]) -> list[int]:
    parts = [{"type": "image_url", "image_url": {"url": "x"}} for _ in images]
    return e.encode_chat(
        [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}], images=images
    )


def reference(model: LongMoE, tok, ids: list[int], images: list[Patches], n: int) -> list[int]:
    """One forward over the whole prompt, then greedy decode with image tokens banned."""
    banned = [tok.image_start_id, tok.image_patch_id, tok.image_end_id]
    with torch.inference_mode():
        emb = model.encode_images(images) if images else None
        out = model(torch.tensor([ids]), use_cache=True, image_embeds=emb)
        cache, logits, toks = out.cache, out.logits[:, -1], []
        for _ in range(n):
            logits = logits.clone()
            logits[:, banned] = -torch.inf
            toks.append(int(logits.argmax()))
            logits = model(torch.tensor([[toks[-1]]]), cache=cache).logits[:, -1]
    return toks


@pytest.mark.parametrize("chunk", [5, 16, 512])
def test_chunked_prefill_with_images_equals_one_forward(engine, vmodel, tok, chunk):
    """Two images (3x5 and 2x2 patches) between text; prefill chunks of 5 tokens cut both spans."""
    imgs = [image(3, 5, 1), image(2, 2, 2)]
    with engine(vmodel, prefill_chunk=chunk) as e:
        ids = chat_ids(e, "what differs between these?", imgs)
        assert ids.count(tok.image_patch_id) == 19
        got = e.generate(ids, GREEDY, images=imgs)
    assert got.token_ids == reference(vmodel, tok, ids, imgs, 10)


def test_the_image_changes_the_output(engine, vmodel):
    """The pixels reach the model (a check that the test above can fail)."""
    with engine(vmodel) as e:
        a = e.generate("describe", GREEDY, images=[image(4, 4, 1)]).token_ids
        b = e.generate("describe", GREEDY, images=[image(4, 4, 2)]).token_ids
    assert a != b


def test_batched_requests_with_and_without_images_equal_each_alone(engine, vmodel):
    reqs = [
        ("look: a", [image(3, 3, 1)]),
        ("plain text only, a little longer than the others", []),
        ("two", [image(2, 5, 2), image(1, 1, 3)]),
        ("look: a", [image(3, 3, 4)]),  # same text, another image
        ("short", []),
    ]
    with engine(vmodel, prefill_chunk=24, max_batch=8) as e:
        alone = [e.generate(t, GREEDY, images=im).token_ids for t, im in reqs]
        handles = [e.submit(t, GREEDY, images=im) for t, im in reqs]  # admitted and prefilled together
        together = [h.result().token_ids for h in handles]
    assert together == alone
    assert alone[0] != alone[3]


def test_prefix_reuse_keys_include_the_pixels(engine, vmodel):
    """Same text + different image: no shared prefix past the image; same image: shared, same tokens."""
    text = " and then a long question about the picture that spans several prefix blocks " * 3
    a_img, b_img = image(3, 4, 1), image(3, 4, 2)
    with engine(vmodel, prefix_cache=True, prefix_block_size=16, prefill_chunk=32) as e:
        a = e.generate(text, GREEDY, images=[a_img])
        b = e.generate(text, GREEDY, images=[b_img])
        c = e.generate(text, GREEDY, images=[a_img])
        d = e.generate(text, GREEDY, images=[Patches(a_img.pixels.clone(), 3, 4)])  # same pixels
    assert a.cached_tokens == 0 and b.cached_tokens == 0  # the image starts in the first block
    assert c.cached_tokens > 0 and d.cached_tokens == c.cached_tokens
    assert c.token_ids == a.token_ids == d.token_ids
    with engine(vmodel) as plain:
        assert b.token_ids == plain.generate(text, GREEDY, images=[b_img]).token_ids
        assert a.token_ids == plain.generate(text, GREEDY, images=[a_img]).token_ids


def test_prefix_hashes_and_hits_separate_images(tok):
    from longmoe.serve.budget import CacheBudget, CacheSpec

    m = tiny_model()
    spec = CacheSpec.of_cache(m.new_cache(1, torch.device("cpu")))
    pc = SnapshotStore(CacheBudget(spec, 1 << 26, 16), 8, torch.device("cpu"))
    ids = list(range(20, 60))
    one, two = ((10, pixel_digest(image(2, 2, s))) for s in (1, 2))
    h0, h1, h2 = pc.hashes(ids), pc.hashes(ids, [one]), pc.hashes(ids, [two])
    assert h0[0] == h1[0] == h2[0]  # block 0 ([0, 8)) is before the image
    assert all(x != y != z for x, y, z in zip(h0[1:], h1[1:], h2[1:], strict=True))  # from its block on
    cache = m.new_cache(1, torch.device("cpu"))
    with torch.inference_mode():
        m(torch.tensor([ids[:32]]), cache=cache)
    assert pc.store(ids, h1, cache, [one])
    assert pc.lookup(ids, h1, marks=[one])[0] == 32
    assert pc.lookup(ids, h2, marks=[two])[0] == 0  # other pixels: a different key
    assert pc.lookup(ids, h1, marks=[two])[0] == 0  # the same key with other pixels (a collision): refused


@pytest.mark.parametrize("draft_kind", ["text-only", "truncated vision"])
def test_speculation_with_images_keeps_the_target_output(engine, vmodel, draft_kind):
    """The draft cannot see images (a text-only draft) or reads the target's embeddings (a vision
    draft of the same width): either way the target verifies every token."""
    draft = tiny_model(seed=3) if draft_kind == "text-only" else truncated_draft(vmodel, 1)
    imgs = [image(3, 5, 1)]
    with engine(vmodel, prefill_chunk=7) as plain:
        want = plain.generate("spec?", GREEDY, images=imgs).token_ids
        text = plain.generate("no image", GREEDY).token_ids
    with engine(vmodel, draft=draft, prefill_chunk=7, prefix_cache=True, num_speculative_tokens=3) as e:
        h1, h2 = e.submit("spec?", GREEDY, images=imgs), e.submit("no image", GREEDY)
        assert h1.result().token_ids == want and h2.result().token_ids == text
        assert e.stats()["spec_proposed"] > 0


def test_image_tokens_are_never_generated(engine, vmodel, tok):
    """A model that prefers <|image_patch|> must not emit it (decode has no pixels: the forward would
    fail and take the whole batch down); the next best token is chosen instead."""
    with engine(vmodel) as e:
        hook = vmodel.register_forward_hook(lambda mod, a, out: out.logits.__setitem__(
            (Ellipsis, tok.image_patch_id), 1e4) or out)  # fmt: skip
        try:
            for p in (GREEDY, SamplingParams(max_tokens=10, temperature=1.0, seed=0, ignore_eos=True)):
                c = e.generate("hi", p, images=[image(2, 2, 1)])
                assert c.finish_reason == "length"
                assert not {tok.image_start_id, tok.image_patch_id, tok.image_end_id} & set(c.token_ids)
        finally:
            hook.remove()


def test_sessions_carry_their_images(engine, vmodel):
    """Turn 2 of a session (text only) continues the kept row whose prompt held an image; it equals
    a fresh request with the whole context and the image; so does turn 3 after the row was evicted."""
    imgs = [image(2, 3, 5)]
    p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with engine(vmodel, prefill_chunk=8) as e:
        s = e.open_session()
        e.generate("first", p, session=s, images=imgs)
        assert len(s.images) == 1
        second = e.generate(" and now?", p, session=s)
        full = s.tokens[: len(s.tokens) - len(second.token_ids)]
        fresh = e.generate(full, p, images=imgs)
        assert second.token_ids == fresh.token_ids and second.cached_tokens > 0
        # the kept row dropped (memory pressure): the next turn re-prefills the whole context, image too
        assert e.sessions.evict_one()
        third = e.generate(" once more", p, session=s)
        full = s.tokens[: len(s.tokens) - len(third.token_ids)]
        assert third.cached_tokens == 0 and third.token_ids == e.generate(full, p, images=imgs).token_ids


def test_refusals_name_the_field(engine, vmodel):
    with engine(tiny_model()) as e, pytest.raises(EngineError) as err:
        e.generate("hi", GREEDY, images=[image(1, 1, 1)])
    assert err.value.param == "images" and "reads text only" in str(err.value)
    with engine(vmodel) as e:
        ids = e.encode_prompt("hi", [image(2, 2, 1)])
        with pytest.raises(EngineError, match="the prompt holds 4 <.image_patch.> tokens but its 1 image"):
            e.generate(ids, GREEDY, images=[image(1, 1, 1)])
        with pytest.raises(EngineError, match="no images were given"):
            e.generate(ids, GREEDY)
        with pytest.raises(EngineError, match="different number of image parts"):  # text spells a span
            chat_ids(e, "sneaky <|image|><|/image|>", [image(1, 1, 1)])
        assert e.generate("still serving", GREEDY).finish_reason == "length"


def test_prompt_images_slice_by_chunk(vmodel):
    imgs = [image(1, 2, 1), image(1, 3, 2)]
    ids = [1, 9, 11, 11, 10, 5, 9, 11, 11, 11, 10]
    pi = PromptImages.of(ids, imgs, 11)
    assert pi.positions == [2, 3, 7, 8, 9] and [m[0] for m in pi.marks] == [2, 7]
    with torch.inference_mode():
        full = vmodel.encode_images(imgs)
        assert pi.embeds(vmodel, 0, 2) is None
        assert torch.equal(pi.embeds(vmodel, 3, 8), full[1:3])
        late = PromptImages.of(ids, imgs, 11)  # restored past the first image: encodes only the second
        assert torch.allclose(late.embeds(vmodel, 8, 11), full[3:5], atol=1e-6)
        assert late._first == 2


def test_compiled_engine_prefills_images_eagerly_with_the_same_tokens(engine):
    """``--compile`` on a vision model: a prompt chunk with images runs the (shape-static) model
    eagerly in reserved cache room, text chunks and decode through the compiled steps; the tokens
    equal the eager engine's. Dynamo's eager backend: the graphs and guards without the C++ build."""
    torch._dynamo.reset()
    m = tiny_vision_model(n_layers=2, layer_pattern="LM", attn_res_blocks=2)
    imgs = [image(3, 5, 1)]
    with engine(m, prefill_chunk=8) as e:
        ids = chat_ids(e, "read this", imgs)
        want = e.generate(ids, GREEDY, images=imgs).token_ids
    e = engine(m, prefill_chunk=8)
    e.compiled = CompiledSteps(m, backend="eager")
    with e:
        assert e.generate(ids, GREEDY, images=imgs).token_ids == want
    m.set_static_shapes(False)
