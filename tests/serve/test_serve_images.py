"""``serve/images.py``: data URIs and image files with good and hostile contents. Each refusal is an
``ImageInputError`` naming the field; no hostile input gets its pixels decoded."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from longmoe.serve import images
from longmoe.serve.images import ImageInputError, ImageLimits, load_data_uri, load_message_images

P = "messages.1.content.0.image_url"
LIMITS = ImageLimits()


def encoded(fmt: str = "PNG", size: tuple[int, int] = (20, 12), color=(200, 30, 90)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def uri(raw: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(side: int) -> bytes:
    """A valid grayscale PNG of ``side``² zero pixels: a few KiB that inflate to ``side``² bytes."""
    z = zlib.compressobj(9)
    row = b"\x00" * (side + 1)  # filter byte + one byte per pixel
    idat = b"".join(z.compress(row) for _ in range(side)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


@pytest.mark.parametrize(("fmt", "media"), [("PNG", "image/png"), ("JPEG", "image/jpeg"),
                                            ("JPEG", "image/jpg"), ("WEBP", "image/webp"),
                                            ("GIF", "image/gif")])  # fmt: skip
def test_good_images_decode_to_rgb(fmt, media):
    im = load_data_uri(uri(encoded(fmt), media), P, LIMITS)
    assert im.mode == "RGB" and im.size == (20, 12)
    r, g, b = im.getpixel((3, 3))
    assert abs(r - 200) < 12 and abs(g - 30) < 12 and abs(b - 90) < 12  # lossy formats: close


def test_media_type_is_case_insensitive_and_may_carry_parameters():
    raw = encoded()
    b64 = base64.b64encode(raw).decode()
    assert load_data_uri(f"DATA:Image/PNG;name=a.png;base64,{b64}", P, LIMITS).size == (20, 12)


def refused(url: str, limits: ImageLimits = LIMITS) -> str:
    with pytest.raises(ImageInputError) as e:
        load_data_uri(url, P, limits)
    assert e.value.param == P
    return e.value.message


def test_truncated_base64_is_refused():
    text = uri(encoded())
    assert "invalid base64" in refused(text[:-3])  # not a multiple of 4: bad padding


def test_truncated_image_is_refused_after_a_clean_base64_cut():
    raw = encoded("PNG", (64, 64))
    cut = raw[: len(raw) // 2 // 3 * 3]  # a whole number of base64 groups: only the image is short
    msg = refused(uri(cut))
    assert "truncated or corrupt" in msg or "not a readable" in msg


def test_base64_outside_the_standard_alphabet_or_with_whitespace_is_refused():
    b64 = base64.b64encode(encoded()).decode()
    assert "invalid base64" in refused(f"data:image/png;base64,{b64[:20]}\n{b64[20:]}")
    assert "invalid base64" in refused(f"data:image/png;base64,{b64[:20]}*{b64[21:]}")


def test_declared_type_must_match_the_bytes():
    assert "declared image/png but the data is a JPEG image" in refused(uri(encoded("JPEG"), "image/png"))
    assert "declared image/gif but the data is a PNG image" in refused(uri(encoded("PNG"), "image/gif"))


def test_non_image_bytes_are_refused():
    assert "not an image" in refused(uri(b"%PDF-1.4 hello, not a picture at all"))
    assert "not an image" in refused(uri(b'{"json": true}'))


def test_unsupported_media_types_and_plain_data_uris_are_refused():
    assert "unsupported media type 'image/svg+xml'" in refused("data:image/svg+xml;base64,PHN2Zz4=")
    assert "unsupported media type 'text/plain'" in refused("data:text/plain;base64,aGk=")
    assert "must be base64-encoded" in refused("data:image/png,%89PNG")
    assert "expected a data URI" in refused("file:///etc/passwd")
    assert "expected a data URI" in refused("")
    assert "holds no data" in refused("data:image/png;base64,")


def test_remote_urls_are_refused_without_a_network_request(monkeypatch):
    import socket

    def no_network(*a, **k):
        raise AssertionError("the server must not open a connection")

    monkeypatch.setattr(socket, "create_connection", no_network)
    for url in ("https://example.com/cat.png", "http://127.0.0.1:1/x.png", "  HTTPS://x/y.jpg"):
        assert "remote image URLs are not fetched" in refused(url)


def test_oversize_image_is_refused_before_base64_decoding(monkeypatch):
    raw = encoded("PNG", (64, 64))
    monkeypatch.setattr(images.base64, "b64decode", lambda *a, **k: pytest.fail("decoded an oversize image"))
    msg = refused(uri(raw), ImageLimits(max_image_bytes=len(raw) // 2))
    assert f"exceeds the limit of {len(raw) // 2} bytes" in msg


def test_png_bomb_is_refused_from_its_header(monkeypatch):
    """6000² = 36M pixels (36 MB inflated) in a ~35 KB file: refused from IHDR, nothing inflated."""
    bomb = png_bomb(6000)
    assert len(bomb) < 64 * 1024
    monkeypatch.setattr(images, "decode_pixels", lambda *a: pytest.fail("decoded a bomb"))
    msg = refused(uri(bomb))
    assert "6000x6000 = 36000000 pixels, more than the limit of 16777216" in msg


def test_a_bomb_past_pillows_own_limit_is_refused_as_too_many_pixels():
    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)
    tiny = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\0" * 64))
    assert "more pixels than the limit" in refused(uri(tiny)) or "more than the limit" in refused(uri(tiny))


def test_pixel_limit_is_inclusive():
    raw = encoded("PNG", (20, 12))
    assert load_data_uri(uri(raw), P, ImageLimits(max_image_pixels=240)).size == (20, 12)
    assert "more than the limit of 239" in refused(uri(raw), ImageLimits(max_image_pixels=239))


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_another_error(data):
    for media in ("image/png", "image/jpeg", "image/gif", "image/webp"):
        try:
            load_data_uri(uri(data, media), P, LIMITS)
        except ImageInputError as e:
            assert e.param == P


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=400), st.binary(min_size=1, max_size=8))
def test_corrupted_pngs_are_refused_or_decoded_never_crash(pos, junk):
    raw = bytearray(encoded("PNG", (16, 16)))
    raw[pos % len(raw) : pos % len(raw) + len(junk)] = junk
    try:
        load_data_uri(uri(bytes(raw)), P, LIMITS)
    except ImageInputError as e:
        assert e.param == P


def test_message_images_in_order_with_field_names():
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": uri(encoded("PNG", (5, 7)))}},
            {"type": "image_url", "image_url": uri(encoded("GIF", (9, 3)), "image/gif")},  # plain string
        ]},
    ]  # fmt: skip
    ims = load_message_images(msgs, LIMITS)
    assert [im.size for im in ims] == [(5, 7), (9, 3)]
    msgs[1]["content"][2]["image_url"] = "data:image/gif;base64,R0lG"
    with pytest.raises(ImageInputError) as e:
        load_message_images(msgs, LIMITS)
    assert e.value.param == "messages.1.content.2.image_url"


def test_too_many_images_is_refused_before_decoding(monkeypatch):
    part = {"type": "image_url", "image_url": {"url": uri(encoded())}}
    msgs = [{"role": "user", "content": [part] * 3}]
    monkeypatch.setattr(images, "load_data_uri", lambda *a: pytest.fail("decoded before counting"))
    with pytest.raises(ImageInputError) as e:
        load_message_images(msgs, ImageLimits(max_images=2))
    assert (
        e.value.param == "messages" and "3 images in the request, more than the limit of 2" in e.value.message
    )


def test_images_only_in_user_messages():
    msgs = [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": uri(encoded())}}]}]
    with pytest.raises(ImageInputError, match="user messages only"):
        load_message_images(msgs, LIMITS)


def test_image_files(tmp_path):
    good = tmp_path / "a.jpg"
    good.write_bytes(encoded("JPEG", (30, 10)))
    assert images.load_image_file(good, "--image", LIMITS).size == (30, 10)
    text = tmp_path / "notes.png"
    text.write_text("just text")
    with pytest.raises(ImageInputError, match="notes.png: not an image"):
        images.load_image_file(text, "--image", LIMITS)
    with pytest.raises(ImageInputError, match="missing.png: no such file"):
        images.load_image_file(tmp_path / "missing.png", "--image", LIMITS)
    with pytest.raises(ImageInputError, match="exceeds the limit of 10"):
        images.load_image_file(good, "--image", ImageLimits(max_image_bytes=10))


def test_limits_are_validated():
    for f in ("max_images", "max_image_bytes", "max_image_pixels"):
        with pytest.raises(ValueError, match=f"{f}: expected an integer >= 1"):
            ImageLimits(**{f: 0})
