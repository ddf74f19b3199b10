"""Packing interleaved image-text documents: spans stay whole, images travel with their windows,
image tokens are never targets, resume is exact, and bad documents fail clearly."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from longmoe.config import IGNORE_INDEX, VisionConfig
from longmoe.data.corpus import DataError, load_documents
from longmoe.data.images import ImageLoader
from longmoe.data.packing import Packer, StreamSource, collate
from tests.helpers.tokenizer import tokenizer_for_tests

VIS = VisionConfig(patch_size=8, max_image_side=32)  # at most 4×4 patches: spans of ≤ 18 tokens


def write_image(path: Path, w: int, h: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
    Image.fromarray(a).save(path)


def write_docs(tmp: Path, n: int = 12) -> Path:
    """``n`` interleaved documents: text, an image of varying size, text, sometimes a second image."""
    (tmp / "img").mkdir(exist_ok=True)
    lines = []
    for i in range(n):
        sizes = [(8 + 8 * (i % 4), 32 - 8 * (i % 3))] + ([(16, 16)] if i % 3 == 0 else [])
        segs = [{"text": f"Document {i} shows a figure: "}]
        for k, (w, h) in enumerate(sizes):
            write_image(tmp / "img" / f"{i}-{k}.png", w, h, 10 * i + k)
            segs += [{"image": f"img/{i}-{k}.png"}, {"text": f" caption {i}.{k} with words {' x' * (i % 5)}"}]
        lines.append(json.dumps({"segments": segs}))
    f = tmp / "docs.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


def packer(path: Path, vision: VisionConfig | None = VIS) -> Packer:
    tok = tokenizer_for_tests()
    src = StreamSource(lambda epoch: load_documents(path), name="images")
    loader = None if vision is None else ImageLoader(vision, tok)
    return Packer(src, tok.encode, tok.bos_id, tok.eos_id, loader)


@pytest.mark.parametrize("window", [20, 33, 64])
def test_spans_whole_images_aligned_labels_text_only(tmp_path, window):
    tok = tokenizer_for_tests()
    p = packer(write_docs(tmp_path))
    image_ids = {tok.image_start_id, tok.image_patch_id, tok.image_end_id}
    seen = 0
    for _ in range(12):
        w = p.next_window(window)
        assert len(w.input_ids) == len(w.labels) == sum(w.seg_lens) == window
        ids = w.input_ids
        # every <|image|> is followed by exactly its patches and <|/image|> inside this window
        starts = [i for i, t in enumerate(ids) if t == tok.image_start_id]
        assert len(starts) == len(w.images) == ids.count(tok.image_end_id)
        for s, img in zip(starts, w.images):
            assert ids[s + 1 : s + 1 + img.n] == [tok.image_patch_id] * img.n
            assert ids[s + 1 + img.n] == tok.image_end_id
        assert sum(im.n for im in w.images) == ids.count(tok.image_patch_id)
        assert not image_ids & set(w.labels)  # loss on text only
        seen += len(w.images)
        b = collate([w])
        assert b.images == w.images
    assert seen >= 5 and p.dropped_images == 0  # every span (≤ 18 tokens) fits these windows


def test_a_span_that_does_not_fit_pads_and_opens_the_next_window(tmp_path):
    tok = tokenizer_for_tests()
    f = write_docs(tmp_path, 3)
    first = packer(f).next_window(64).input_ids.index(tok.image_start_id)  # document 0's first image
    p = packer(f)
    w1, w2 = p.next_window(first + 5), p.next_window(40)  # its 4×3-patch span (14 tokens) cannot fit
    assert tok.image_start_id not in w1.input_ids and w1.input_ids[first:] == [tok.pad_id] * 5
    assert w1.labels[first - 1 :] == [IGNORE_INDEX] * 6  # the <|image|> target, then the padding
    assert w1.seg_lens == [first, 5]  # text segment + padding segment
    assert w2.input_ids[0] == tok.image_start_id and w2.images


def test_an_image_longer_than_the_window_is_dropped_text_kept(tmp_path):
    tok = tokenizer_for_tests()
    p = packer(write_docs(tmp_path, 4))
    ws = [p.next_window(8) for _ in range(30)]  # every span (≥ 6 patches + 2) > 8 except tiny ones
    assert p.dropped_images > 0
    text = tok.decode([t for w in ws for t in w.input_ids if t > 11])
    assert "caption 0.0" in text and "Document 1" in text
    for w in ws:
        assert sum(im.n for im in w.images) == w.input_ids.count(tok.image_patch_id)


@pytest.mark.parametrize("k", [0, 1, 3, 7])
def test_resume_reproduces_the_image_stream(tmp_path, k):
    f = write_docs(tmp_path)
    a = packer(f)
    for _ in range(k):
        a.next_window(24)
    state = a.state()
    ref = [a.next_window(24) for _ in range(6)]
    b = packer(f)
    b.restore(json.loads(json.dumps(state)))  # the checkpoint stores it as plain data
    got = [b.next_window(24) for _ in range(6)]
    for x, y in zip(ref, got):
        assert (x.input_ids, x.labels, x.seg_lens) == (y.input_ids, y.labels, y.seg_lens)
        assert len(x.images) == len(y.images)
        assert all(torch.equal(i.pixels, j.pixels) for i, j in zip(x.images, y.images))


def png_uri(w: int, h: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 30)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def one_doc(tmp_path: Path, segments) -> Path:
    f = tmp_path / "one.jsonl"
    f.write_text(json.dumps({"segments": segments}) + "\n")
    return f


def test_data_uri_images_and_errors(tmp_path):
    p = packer(one_doc(tmp_path, [{"text": "a green box"}, {"image": png_uri(16, 8)}, {"text": "done"}]))
    w = p.next_window(64)  # the one document, repeated every epoch
    assert w.images and all((im.rows, im.cols) == (1, 2) for im in w.images)
    assert abs(float(w.images[0].pixels[0, 64 + 3]) - 200 / 255) < 1e-6  # green channel
    with pytest.raises(DataError, match="one.jsonl:1: image 'missing.png': image file not found"):
        packer(one_doc(tmp_path, [{"text": "x"}, {"image": "missing.png"}])).next_window(16)
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DataError, match="bad.png"):
        packer(one_doc(tmp_path, [{"image": "bad.png"}])).next_window(16)
    with pytest.raises(DataError, match="not valid base64"):
        packer(one_doc(tmp_path, [{"image": "data:image/png;base64,!!!"}])).next_window(16)
    with pytest.raises(DataError, match="no vision encoder"):
        packer(one_doc(tmp_path, [{"image": png_uri(8, 8)}]), vision=None).next_window(16)
    with pytest.raises(DataError, match="literal text"):
        packer(one_doc(tmp_path, [{"text": "see <|image_patch|> here"}])).next_window(16)


@pytest.mark.parametrize(
    "segments, match",
    [
        ("text", '"segments" must be a list'),
        ([{"text": 3}], r"segments\[0\]"),
        ([{"text": "a", "image": "b"}], r"segments\[0\]"),
        ([{"video": "x.mp4"}], r"segments\[0\]"),
    ],
)
def test_malformed_segments_name_the_line(tmp_path, segments, match):
    f = tmp_path / "d.jsonl"
    f.write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"segments": segments}) + "\n")
    with pytest.raises(DataError, match=match) as e:
        list(load_documents(f))
    assert "d.jsonl:2: " in str(e.value)


def test_text_documents_pack_as_before_with_a_vision_model(tmp_path):
    """A vision model's packer changes nothing for plain text documents."""
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(json.dumps({"text": f"plain text number {i} " * (i + 1)}) for i in range(6)))
    a, b = packer(f, vision=None), packer(f)
    for _ in range(5):
        x, y = a.next_window(17), b.next_window(17)
        assert (x.input_ids, x.labels, x.seg_lens, y.images) == (y.input_ids, y.labels, y.seg_lens, [])
