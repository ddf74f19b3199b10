"""What a file becomes (``serve/files/documents.py``), and hostile files refused with one line each
within the per-document budget: truncated, malformed and encrypted PDFs, page-count and deflate
bombs, archives, binary data, wrong media types and extensions, bad file names."""

from __future__ import annotations

import io
import time

import pytest
import torch
from PIL import Image

from longmoe.serve.files import make_pdf
from longmoe.serve.files.documents import DocumentError, DocumentLimits, check_filename, parse
from tests.helpers.documents import (
    deflate_bomb_pdf,
    encrypted_pdf,
    huge_image_pdf,
    image_pdf,
    many_pages_pdf,
    png,
    text_pdf,
)

pytest.importorskip("pypdf")
pytest.importorskip("pypdfium2")


def test_pdf_text_layer_becomes_pages_with_markers():
    d = parse(text_pdf(["Alpha beta gamma delta", "Second page text here"]), "a.pdf", "application/pdf")
    assert d.kind == "pdf" and d.pages == ["Alpha beta gamma delta", "Second page text here"]
    assert d.images == {}
    block = d.block()
    assert block.startswith('<document name="a.pdf" pages="2">\n--- page 1 ---\nAlpha beta gamma delta\n')
    assert block.endswith("--- page 2 ---\nSecond page text here\n</document>\n")


def test_pages_without_text_layer_are_rendered_and_on_request_every_page():
    d = parse(image_pdf(2), "scan.pdf")
    assert d.text_pages == 0 and sorted(d.images) == [0, 1]
    assert all(raw.startswith(b"\x89PNG") for raw in d.images.values())
    assert "[page image below]" in d.block() and "[no text on this page]" in d.block(with_images=False)
    both = parse(text_pdf(["Some real text on the page"]), "t.pdf", pages_as="images")
    assert sorted(both.images) == [0]


def test_text_and_image_files():
    assert parse(b"a,b\n1,2\n", "t.csv", "text/csv").pages == ["a,b\n1,2\n"]
    assert parse(b'{"a": 1}', "x.json", "application/json").kind == "text"
    assert parse("# Titel ü\n".encode(), "r.md").pages == ["# Titel ü\n"]
    im = parse(png(), "p.png", "image/png")
    assert im.kind == "image" and list(im.images) == [0]


HOSTILE = {
    "truncated": (lambda: text_pdf(["hello there world"])[:300], "x.pdf", None, "not a readable PDF"),
    "malformed": (lambda: b"%PDF-1.7\n1 0 obj << /Type /Catalog >> junk", "x.pdf", None, "not a readable"),
    "encrypted": (lambda: encrypted_pdf(), "x.pdf", None, "encrypted"),
    "page bomb": (lambda: many_pages_pdf(5000), "x.pdf", None, "parsing budget|pages"),
    "deflate bomb": (lambda: deflate_bomb_pdf(64 << 20), "x.pdf", None, "parsing budget|inflates to more"),
    "image bomb": (lambda: huge_image_pdf(40000), "x.pdf", None, "inflates to more"),
    "zip": (lambda: b"PK\x03\x04" + b"\x00" * 100, "x.zip", None, "zip archives"),
    "gzip": (lambda: b"\x1f\x8b\x08" + b"\x00" * 100, "x.txt", None, "gzip archives"),
    "binary": (lambda: b"\x00\x01\x02\xff" * 10, "x.bin", None, "UTF-8|NUL"),
    "nul text": (lambda: b"abc\x00def", "x.txt", None, "NUL"),
    "pdf as text": (lambda: text_pdf(["abc def ghi jkl"]), "x.txt", None, "says .txt but the data is a PDF"),
    "text as pdf": (lambda: b"just text", "x.txt", "application/pdf", "declared application/pdf"),
    "png as pdf": (lambda: png(), "x.png", "application/pdf", "declared application/pdf"),
    "exe mime": (lambda: b"MZ text", "x", "application/x-msdownload", "unsupported media type"),
    "empty": (lambda: b"", "x.txt", None, "empty"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_refused_with_a_reason(case):
    make, name, mime, reason = HOSTILE[case]
    limits = DocumentLimits(max_pages=2000, max_decompressed=8 << 20, max_seconds=20)
    t = time.monotonic()
    with pytest.raises(DocumentError, match=reason):
        parse(make(), name, mime, limits)
    assert time.monotonic() - t < 20


def test_the_time_budget_kills_the_parser():
    with pytest.raises(DocumentError, match="longer than the limit|budget"):
        parse(many_pages_pdf(200_000), "x.pdf", limits=DocumentLimits(max_seconds=0.2, max_pages=10**6))


@pytest.mark.parametrize(
    "name", ["../etc/passwd", "a/b.pdf", "a\\b.pdf", "a\x00.pdf", "a\nb.pdf", "", "..", "x" * 300]
)
def test_bad_file_names_are_refused(name):
    with pytest.raises(DocumentError, match="file name"):
        check_filename(name)


def _page(w: int, h: int, seed: int = 0) -> Image.Image:
    """A page image with detail at every pixel (noise), so any resampling shows."""
    g = torch.Generator().manual_seed(seed)
    px = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
    return Image.fromarray(px, "RGB")


def _rendered(raw: bytes, limits: DocumentLimits | None = None) -> Image.Image:
    doc = parse(raw, "p.pdf", "application/pdf", limits, pages_as="images")
    return Image.open(io.BytesIO(doc.images[0])).convert("RGB")


@pytest.mark.parametrize("size", [(40, 24), (200, 130), (256, 256)])
def test_a_page_written_at_one_point_per_pixel_renders_back_to_its_pixels_never_enlarged(size):
    page = _page(*size)
    back = _rendered(make_pdf.image_pdf(page), DocumentLimits(render_side=256))
    assert back.size == page.size and back.tobytes() == page.tobytes()


@pytest.mark.parametrize("dpi", [144, 288])
def test_a_scan_renders_at_its_own_resolution_not_at_72_dpi(dpi):
    page = _page(96, 64, seed=1)  # at 288 dpi: a page of 24 x 16 points
    back = _rendered(make_pdf.image_pdf(page, dpi=dpi), DocumentLimits(render_side=256))
    assert back.size == page.size and back.tobytes() == page.tobytes()


@pytest.mark.parametrize("size", [(512, 384), (300, 900)])
def test_a_page_larger_than_render_side_is_shrunk_to_fit_with_its_aspect(size):
    back = _rendered(make_pdf.image_pdf(_page(*size)), DocumentLimits(render_side=256))
    scale = 256 / max(size)
    assert max(back.size) == 256
    assert all(abs(got - side * scale) <= 1 for got, side in zip(back.size, size, strict=True))  # aspect
