"""PDFs written here, never downloaded fixtures: ``text_pdf``, text with a real text layer (Helvetica,
one text line per ``LINE_CHARS`` characters, ``LINES_PER_PAGE`` lines a page), for test documents and
``longmoe eval longctx --as-files pdf``; ``image_pdf``, a page image with no text layer (a scan),
losslessly, for ``longmoe eval extract --extract-input pdf``. Both through ``pypdf``."""

from __future__ import annotations

import io

LINE_CHARS = 90
LINES_PER_PAGE = 50
POINTS_PER_INCH = 72  # PDF's unit: a point is 1/72 inch


def text_pdf(pages: list[str]) -> bytes:
    """A PDF whose page ``i`` shows ``pages[i]`` (latin-1 text; other characters become ``?``)."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    w = PdfWriter()
    font = w._add_object(
        DictionaryObject(
            {
                NameObject("/Type"): NameObject("/Font"),
                NameObject("/Subtype"): NameObject("/Type1"),
                NameObject("/BaseFont"): NameObject("/Helvetica"),
            }
        )
    )
    for text in pages:
        p = w.add_blank_page(612, 792)
        p[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
        lines = [text[i : i + LINE_CHARS] for i in range(0, len(text), LINE_CHARS)] or [""]
        esc = [ln.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for ln in lines]
        ops = "".join(f"({ln}) Tj 0 -14 Td " for ln in esc)
        s = DecodedStreamObject()
        s.set_data(f"BT /F1 11 Tf 40 750 Td {ops}ET".encode("latin-1", "replace"))
        p[NameObject("/Contents")] = w._add_object(s)
    buf = io.BytesIO()
    w.write(buf)
    return buf.getvalue()


def image_pdf(image, dpi: float = POINTS_PER_INCH) -> bytes:  # noqa: ANN001 - a PIL image
    """A one-page PDF that is ``image`` and nothing else, as a scanner writes a page at ``dpi``: a page
    of ``width × height × 72 / dpi`` points (at the default 72 dpi one point per pixel, as Pillow writes
    a page image) drawing the RGB pixels stored losslessly (``FlateDecode``; Pillow's own PDF writer
    stores them as JPEG), no text layer. Rendered at its own resolution (``parse_worker.render``) it
    gives back exactly ``image``'s pixels."""
    from pypdf import PdfWriter
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject, NumberObject

    if not dpi > 0:
        raise ValueError(f"dpi: expected a number > 0, got {dpi!r}")
    rgb = image.convert("RGB")
    w, h = rgb.size
    pixels = DecodedStreamObject()
    pixels.set_data(rgb.tobytes())  # rows top to bottom, 3 bytes a pixel: the PDF image sample order
    pixels.update(
        {
            NameObject("/Type"): NameObject("/XObject"),
            NameObject("/Subtype"): NameObject("/Image"),
            NameObject("/Width"): NumberObject(w),
            NameObject("/Height"): NumberObject(h),
            NameObject("/ColorSpace"): NameObject("/DeviceRGB"),
            NameObject("/BitsPerComponent"): NumberObject(8),
        }
    )
    pw, ph = w * POINTS_PER_INCH / dpi, h * POINTS_PER_INCH / dpi
    out = PdfWriter()
    page = out.add_blank_page(pw, ph)
    stored = out._add_object(pixels.flate_encode())
    page[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/XObject"): DictionaryObject({NameObject("/Im0"): stored})}
    )
    draw = DecodedStreamObject()
    draw.set_data(f"q {pw:g} 0 0 {ph:g} 0 0 cm /Im0 Do Q".encode())  # the image over the whole page
    page[NameObject("/Contents")] = out._add_object(draw)
    buf = io.BytesIO()
    out.write(buf)
    return buf.getvalue()


def paginate(text: str) -> list[str]:
    """``text`` cut into pages of ``LINES_PER_PAGE`` lines of ``LINE_CHARS`` characters (newlines
    become spaces: a PDF line is a fixed width here)."""
    flat = " ".join(text.split("\n"))
    n = LINE_CHARS * LINES_PER_PAGE
    return [flat[i : i + n] for i in range(0, len(flat), n)] or [""]
