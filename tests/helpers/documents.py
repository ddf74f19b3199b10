"""Documents made on the spot for the Files API tests (never downloaded fixtures): PDFs with a text
layer written through pypdf, image-only PDFs through Pillow, and hostile variants."""

from __future__ import annotations

import io
import zlib

from PIL import Image, ImageDraw
from pypdf import PdfWriter

from longmoe.serve.files.make_pdf import text_pdf

__all__ = [
    "text_pdf",
    "image_pdf",
    "png",
    "many_pages_pdf",
    "deflate_bomb_pdf",
    "huge_image_pdf",
    "encrypted_pdf",
]


def image_pdf(n_pages: int = 1, size: tuple[int, int] = (120, 80)) -> bytes:
    """A scanned-looking PDF: pages that are images only (no text layer), saved by Pillow."""
    ims = []
    for i in range(n_pages):
        im = Image.new("RGB", size, "white")
        ImageDraw.Draw(im).rectangle([10, 10, 10 + 20 * (i + 1), 40], fill="black")
        ims.append(im)
    buf = io.BytesIO()
    ims[0].save(buf, "PDF", save_all=True, append_images=ims[1:])
    return buf.getvalue()


def png(size: tuple[int, int] = (24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, "red").save(buf, "PNG")
    return buf.getvalue()


def many_pages_pdf(n: int) -> bytes:
    """A PDF claiming ``n`` pages (one shared empty page object listed ``n`` times: a page-count bomb
    that costs a few bytes per page)."""
    kids = " ".join(["3 0 R"] * n)
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 10 10] >>",
    ]
    return _assemble(objs)


def deflate_bomb_pdf(inflated: int) -> bytes:
    """A one-page PDF whose content stream inflates from a few KiB to ``inflated`` bytes."""
    data = zlib.compress(b" " * inflated, 9)
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 10 10] /Contents 4 0 R >>",
        f"<< /Length {len(data)} /Filter /FlateDecode >>\nstream\n".encode() + data + b"\nendstream",
    ]
    return _assemble(objs)


def huge_image_pdf(side: int) -> bytes:
    """A one-page PDF drawing a ``side x side`` image whose few KiB of deflated data would decode to
    ``3 side²`` bytes (an image bomb for a renderer)."""
    data = zlib.compress(b"\x00" * (side * 64), 9)  # far fewer bytes than declared: never decoded
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 10 10] /Resources << /XObject << /Im0 5 0 R >> >>"
        b" /Contents 4 0 R >>",
        b"<< /Length 28 >>\nstream\nq 10 0 0 10 0 0 cm /Im0 Do Q\nendstream",
        f"<< /Type /XObject /Subtype /Image /Width {side} /Height {side} /ColorSpace /DeviceRGB "
        f"/BitsPerComponent 8 /Filter /FlateDecode /Length {len(data)} >>\nstream\n".encode()
        + data
        + b"\nendstream",
    ]
    return _assemble(objs)


def _assemble(objs: list[bytes]) -> bytes:
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for i, o in enumerate(objs, 1):
        offsets.append(len(out))
        out += f"{i} 0 obj\n".encode() + o + b"\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def encrypted_pdf(text: str = "secret", password: str = "pw") -> bytes:
    from pypdf import PdfReader

    w = PdfWriter(clone_from=PdfReader(io.BytesIO(text_pdf([text]))))
    w.encrypt(user_password=password, owner_password=password + "o", algorithm="RC4-128")
    buf = io.BytesIO()
    w.write(buf)
    return buf.getvalue()
