"""data/images.py: decoding untrusted bytes, the resize rule, the patch layout, spans and label masks."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
import torch
from PIL import Image

from longmoe.config import IGNORE_INDEX, IMAGE_PATCH_TOKEN_ID, VisionConfig
from longmoe.data.images import (
    ImageError,
    decode_image,
    image_span,
    image_tokens,
    mask_image_labels,
    patchify,
    resize,
    resized_size,
    to_tensor,
    unpatchify,
)
from tests.helpers.tokenizer import tokenizer_for_tests

CFG = VisionConfig(patch_size=8, max_image_side=64)


def noise_image(w: int, h: int, seed: int = 0, mode: str = "RGB") -> Image.Image:
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 256, (h, w, len(mode)), generator=g, dtype=torch.uint8).numpy()
    return Image.fromarray(a, mode)


def png(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize("size", [(64, 64), (37, 90), (200, 13), (3, 5), (1000, 1), (64, 8), (17, 17)])
def test_patchify_round_trip_and_resize_rule(size):
    """unpatchify(patchify(x)) is exactly the resized image; sides are multiples of the patch size,
    the longer at most max_image_side, the aspect ratio kept to within a patch."""
    w, h = size
    img = noise_image(w, h)
    p = patchify(img, CFG)
    rh, rw = resized_size(h, w, CFG)
    assert (p.rows * 8, p.cols * 8) == (rh, rw)
    assert max(rh, rw) <= 64 and rh % 8 == 0 and rw % 8 == 0 and p.rows >= 1 and p.cols >= 1
    assert p.pixels.shape == (p.rows * p.cols, 3 * 64) and p.pixels.dtype == torch.float32
    assert float(p.pixels.min()) >= 0.0 and float(p.pixels.max()) <= 1.0
    assert torch.equal(unpatchify(p, 8), to_tensor(resize(img, CFG)))
    scale = min(1.0, 64 / max(w, h))
    assert abs(rh - h * scale) <= 4 + 1e-9 or rh == 8
    assert abs(rw - w * scale) <= 4 + 1e-9 or rw == 8
    assert image_tokens(h, w, CFG) == p.rows * p.cols + 2


def test_patch_layout_is_row_major_channel_first():
    """Patch (r, c) holds pixels [r*P:(r+1)*P, c*P:(c+1)*P] of every channel, flattened (c, y, x)."""
    img = noise_image(24, 16, 3)  # already a multiple of 8: no resize
    x = to_tensor(img)
    p = patchify(img, CFG)
    assert (p.rows, p.cols) == (2, 3)
    r, c = 1, 2
    assert torch.equal(p.pixels[r * 3 + c], x[:, 8:16, 16:24].reshape(-1))


def test_small_image_keeps_its_size_and_big_one_is_scaled():
    assert resized_size(16, 24, CFG) == (16, 24)
    assert resized_size(640, 320, CFG) == (64, 32)
    assert resized_size(2, 2, CFG) == (8, 8)  # at least one patch


def test_decode_image_formats_and_alpha():
    img = noise_image(20, 10, 1)
    for fmt in ("PNG", "BMP", "WEBP"):
        out = decode_image(png(img, fmt))
        assert out.mode == "RGB" and out.size == (20, 10)
    assert decode_image(png(img)).tobytes() == img.tobytes()  # PNG is lossless
    assert decode_image(png(img, "JPEG")).size == (20, 10)
    clear = Image.new("RGBA", (4, 4), (0, 0, 0, 0))  # fully transparent: white, not black
    assert decode_image(png(clear)).getpixel((1, 1)) == (255, 255, 255)


def _png_bomb(w: int, h: int) -> bytes:
    """A valid PNG header claiming w×h pixels, with a tiny (zlib) body: a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = zlib.compress(b"\x00" * (w + 1) * 64)  # far fewer rows than claimed
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def test_decode_image_hostile_inputs():
    with pytest.raises(ImageError, match="not an image"):
        decode_image(b"hello, this is text" * 10)
    with pytest.raises(ImageError, match="empty"):
        decode_image(b"")
    data = png(noise_image(40, 40, 2))
    with pytest.raises(ImageError, match="truncated or corrupt"):
        decode_image(data[: len(data) // 2])
    with pytest.raises(ImageError, match="more than the limit"):
        decode_image(_png_bomb(6_000, 6_000))  # 36M pixels: our limit, checked from the header
    with pytest.raises(ImageError, match="decompression bomb"):
        decode_image(_png_bomb(50_000, 50_000))  # 2.5G pixels: Pillow's own guard fires in open()
    with pytest.raises(ImageError, match="more than the limit"):
        decode_image(png(noise_image(40, 40)), max_pixels=1000)
    with pytest.raises(ImageError, match="expected bytes"):
        decode_image("a string")  # type: ignore[arg-type]
    assert issubclass(ImageError, ValueError)


def test_image_span_and_label_mask():
    tok = tokenizer_for_tests()
    assert tok.image_patch_id == IMAGE_PATCH_TOKEN_ID  # the id the model looks for
    p = patchify(noise_image(16, 8), CFG)  # 1×2 patches
    span = image_span(p, tok)
    assert span == [tok.image_start_id, tok.image_patch_id, tok.image_patch_id, tok.image_end_id]
    ids = tok.encode("look:") + span + tok.encode(" a cat")
    labels = ids[1:] + [IGNORE_INDEX]
    masked = mask_image_labels(labels, tok)
    image = set(span)
    for t, (lab, m) in enumerate(zip(labels, masked)):
        assert m == (IGNORE_INDEX if lab in image else lab), t
    # the <|/image|> position still predicts the text after the image
    end_pos = ids.index(tok.image_end_id)
    assert masked[end_pos] == labels[end_pos] != IGNORE_INDEX
    tm = mask_image_labels(torch.tensor([labels]), tok)
    assert tm.tolist() == [masked]
