"""Images sent to the server: OpenAI ``image_url`` content parts as data URIs, checked before decoding.

A part is ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`` (``image_url``
may also be the URL string itself). Every check that can run before the pixels are decoded does, in
order of cost, so a hostile request costs little:

1. the URL is a ``data:`` URI (an ``http(s)`` URL is refused: the server never reaches the network);
2. the declared media type is one of ``MEDIA_TYPES`` and the payload is marked ``;base64``;
3. the base64 text is no longer than ``ImageLimits.max_image_bytes`` allows, then decoded strictly
   (only the standard alphabet, correct padding, no whitespace: a truncated payload is an error);
4. the bytes' signature names the same format as the declared type (``image/png`` holding a JPEG
   is refused, as is text posing as an image);
5. the width and height read from the header (no pixels decoded) are within ``max_image_pixels``:
   a PNG "decompression bomb" (a few KiB inflating to gigapixels) is refused here;
6. only then are the pixels decoded (``data.images.decode_image``), which still refuses truncated
   or corrupt data.

Every failure is an ``ImageInputError`` naming the request field (``messages.1.content.0.image_url``)
that the API turns into a 400 in OpenAI's error shape.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from longmoe.config import VisionConfig
from longmoe.data.images import ImageError, decode_image, patchify
from longmoe.layers.vision import Patches

MEDIA_TYPES = {  # declared media type -> Pillow's format name
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",  # a common misspelling of image/jpeg
    "image/webp": "WEBP",
    "image/gif": "GIF",
}
SIGNATURES = (  # (file signature prefix, format); WebP is RIFF....WEBP, checked separately
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)
FORMAT_NAMES = {"PNG": "PNG", "JPEG": "JPEG", "WEBP": "WebP", "GIF": "GIF"}
_DATA_URI = re.compile(r"^data:([^,;]*)((?:;[^,;]*)*),", re.IGNORECASE)


class ImageInputError(ValueError):
    """An image the server refuses; ``param`` names the request field that holds it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


@dataclass(frozen=True)
class ImageLimits:
    """What one request may send (validated). Defaults suit the 1 MiB default body limit."""

    max_images: int = 4  # images per request
    max_image_bytes: int = 1 << 20  # encoded bytes per image (after base64 decoding)
    max_image_pixels: int = 4096 * 4096  # width * height per image, read from the header

    def __post_init__(self) -> None:
        for f in ("max_images", "max_image_bytes", "max_image_pixels"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected an integer >= 1, got {v!r}")


def sniff_format(raw: bytes) -> str | None:
    """The image format the bytes' signature names (``PNG``, ``JPEG``, ``WEBP``, ``GIF``), or None."""
    for sig, fmt in SIGNATURES:
        if raw.startswith(sig):
            return fmt
    if len(raw) >= 12 and raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "WEBP"
    return None


def decode_data_uri(url: str, param: str, limits: ImageLimits) -> tuple[str, bytes]:
    """A ``data:image/...;base64,...`` URI as ``(format, bytes)``; steps 1-4 of the module docstring."""
    if re.match(r"^\s*https?://", url, re.IGNORECASE):
        raise ImageInputError(
            param,
            "remote image URLs are not fetched (the server makes no network requests); "
            "send the image inline as a data URI: data:image/png;base64,...",
        )
    m = _DATA_URI.match(url)
    if m is None:
        raise ImageInputError(param, "expected a data URI: data:image/png;base64,...")
    media = m.group(1).strip().lower()
    params = [p.strip().lower() for p in m.group(2).split(";") if p.strip()]
    if media not in MEDIA_TYPES:
        allowed = ", ".join(k for k in MEDIA_TYPES if k != "image/jpg")
        raise ImageInputError(param, f"unsupported media type '{media[:40]}': expected one of {allowed}")
    if not params or params[-1] != "base64":
        raise ImageInputError(param, "the data URI must be base64-encoded (data:image/png;base64,...)")
    text = url[m.end() :]
    if len(text) > 4 * (-(-limits.max_image_bytes // 3)):  # ceil(bytes / 3) groups of 4 characters
        raise ImageInputError(
            param, f"image exceeds the limit of {limits.max_image_bytes} bytes (about {len(text) * 3 // 4})"
        )
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ImageInputError(param, f"invalid base64 ({e}); is the data truncated?") from None
    if not raw:
        raise ImageInputError(param, "the data URI holds no data")
    fmt = sniff_format(raw)
    want = MEDIA_TYPES[media]
    if fmt is None:
        raise ImageInputError(
            param, f"the data is not an image (declared {media}; no PNG, JPEG, WebP or GIF signature)"
        )
    if fmt != want:
        raise ImageInputError(param, f"declared {media} but the data is a {FORMAT_NAMES[fmt]} image")
    return fmt, raw


def check_header(raw: bytes, fmt: str, param: str, limits: ImageLimits) -> tuple[int, int]:
    """Width and height from the header alone (Pillow opens lazily: no pixels are decoded), within
    ``max_image_pixels``; step 5 of the module docstring."""
    try:
        with warnings.catch_warnings():  # Pillow's own bomb warning: the limit below is ours
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw), formats=[fmt]) as im:
                w, h = im.size
    except Image.DecompressionBombError:  # far past Pillow's own limit (which ours is below)
        raise ImageInputError(
            param, f"image has more pixels than the limit of {limits.max_image_pixels}"
        ) from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ImageInputError(param, f"not a readable {FORMAT_NAMES[fmt]} image ({e})") from None
    if w < 1 or h < 1:
        raise ImageInputError(param, f"image has no pixels ({w}x{h})")
    if w * h > limits.max_image_pixels:
        raise ImageInputError(
            param, f"image is {w}x{h} = {w * h} pixels, more than the limit of {limits.max_image_pixels}"
        )
    return w, h


def load_image_bytes(raw: bytes, param: str, limits: ImageLimits) -> Image.Image:
    """Bytes of an image file, checked as a data URI's payload is (signature, size, header, decode)."""
    if len(raw) > limits.max_image_bytes:
        raise ImageInputError(
            param, f"image of {len(raw)} bytes exceeds the limit of {limits.max_image_bytes}"
        )
    fmt = sniff_format(raw)
    if fmt is None:
        raise ImageInputError(param, "not an image (no PNG, JPEG, WebP or GIF signature)")
    check_header(raw, fmt, param, limits)
    return decode_pixels(raw, param, limits)


def decode_pixels(raw: bytes, param: str, limits: ImageLimits) -> Image.Image:
    """The decoded RGB image (step 6, ``data.images.decode_image``: transparency on white, as in
    training); truncated or corrupt data is an ``ImageInputError``."""
    try:
        return decode_image(raw, max_pixels=limits.max_image_pixels)
    except ImageError as e:
        raise ImageInputError(param, str(e)) from None


def load_data_uri(url: str, param: str, limits: ImageLimits) -> Image.Image:
    """A data URI's image, decoded, after every check of the module docstring."""
    fmt, raw = decode_data_uri(url, param, limits)
    check_header(raw, fmt, param, limits)
    return decode_pixels(raw, param, limits)


def load_image_file(path: str | Path, param: str, limits: ImageLimits) -> Image.Image:
    """An image file from disk (``longmoe generate --image``), with the same checks as the API."""
    p = Path(path)
    if not p.is_file():
        raise ImageInputError(param, f"{path}: no such file")
    if p.stat().st_size > limits.max_image_bytes:
        raise ImageInputError(
            param, f"{path}: {p.stat().st_size} bytes exceeds the limit of {limits.max_image_bytes}"
        )
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ImageInputError(param, f"{path}: cannot read ({e.strerror})") from None
    try:
        return load_image_bytes(raw, param, limits)
    except ImageInputError as e:
        raise ImageInputError(param, f"{path}: {e.message}") from None


def image_url_of(part: dict, param: str) -> str:
    """The URL of an ``image_url`` content part: ``{"url": ...}`` or the string itself."""
    v = part.get("image_url")
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("url"), str):
        return v["url"]
    raise ImageInputError(param, 'expected {"url": "data:image/...;base64,..."} or a data URI string')


def message_image_parts(messages: list[dict]) -> list[tuple[str, str]]:
    """``(param, url)`` of every image part, in order; images are allowed in user messages only (as in
    OpenAI's API)."""
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            param = f"messages.{i}.content.{j}.image_url"
            if m.get("role") != "user":
                raise ImageInputError(
                    param, f"images are allowed in user messages only, not '{m.get('role')}'"
                )
            out.append((param, image_url_of(part, param)))
    return out


def load_message_images(messages: list[dict], limits: ImageLimits) -> list[Image.Image]:
    """Every image of a chat request, decoded and checked; the count is checked before any decoding."""
    parts = message_image_parts(messages)
    if len(parts) > limits.max_images:
        raise ImageInputError(
            "messages", f"{len(parts)} images in the request, more than the limit of {limits.max_images}"
        )
    return [load_data_uri(url, param, limits) for param, url in parts]


TEXT_ONLY = "this model reads text only (its config has no 'vision'); send the request without images"


def chat_patches(messages: list[dict], limits: ImageLimits, vision: VisionConfig | None) -> list[Patches]:
    """The ``Patches`` of a chat request's image parts, in order, after every check; a text-only
    model (``vision`` None) refuses the first image part before anything is decoded."""
    parts = message_image_parts(messages)
    if parts and vision is None:
        raise ImageInputError(parts[0][0], TEXT_ONLY)
    return [patchify(im, vision) for im in load_message_images(messages, limits)] if parts else []


def file_patches(
    paths: list[str], limits: ImageLimits, vision: VisionConfig | None, param: str
) -> list[Patches]:
    """Image files as ``Patches`` (``longmoe generate --image``, ``longmoe chat``), after every check."""
    if len(paths) > limits.max_images:
        raise ImageInputError(param, f"{len(paths)} images, more than the limit of {limits.max_images}")
    if paths and vision is None:
        raise ImageInputError(param, TEXT_ONLY)
    return [patchify(load_image_file(p, param, limits), vision) for p in paths]


def to_data_uri(raw: bytes) -> str:
    """An image file's bytes as a data URI (for clients and tests)."""
    fmt = sniff_format(raw)
    if fmt is None:
        raise ValueError("not a PNG, JPEG, WebP or GIF image")
    media = next(k for k, v in MEDIA_TYPES.items() if v == fmt)
    return f"data:{media};base64,{base64.b64encode(raw).decode()}"
