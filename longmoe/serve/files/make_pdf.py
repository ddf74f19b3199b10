"""Text written as a PDF with a real text layer (Helvetica, one text line per ``LINE_CHARS``
characters, ``LINES_PER_PAGE`` lines a page), through ``pypdf``: test documents and
``longmoe eval longctx --as-files pdf`` make their PDFs here, never from downloaded fixtures."""

from __future__ import annotations

import io

LINE_CHARS = 90
LINES_PER_PAGE = 50


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


def paginate(text: str) -> list[str]:
    """``text`` cut into pages of ``LINES_PER_PAGE`` lines of ``LINE_CHARS`` characters (newlines
    become spaces: a PDF line is a fixed width here)."""
    flat = " ".join(text.split("\n"))
    n = LINE_CHARS * LINES_PER_PAGE
    return [flat[i : i + n] for i in range(0, len(flat), n)] or [""]
