"""One document parsed in a child process (``documents.parse`` runs it), so a hostile file can cost at
most the budget: the parent kills it at the time limit, and the kernel caps its memory and CPU time
(``resource`` limits set before it starts). It imports only the standard library, ``pypdf``,
``pypdfium2`` and Pillow (run as a script: no package, no torch).

stdin: the file's bytes; argv[1]: a JSON object of options (``pages_as``: ``text`` | ``auto`` |
``images``; ``max_pages``; ``max_chars``; ``max_decompressed``; ``render``: how many pages may be
rendered; ``render_side``: the most pixels on the longer side of a rendered page: a page renders at
its own resolution (``render``), shrunk to fit, never enlarged). stdout: one JSON object,
``{"pages": [text per page], "images": {page index: base64 PNG}, "encrypted": bool}`` or
``{"error": "one line"}``.
"""

from __future__ import annotations

import base64
import io
import json
import sys

MIN_TEXT_CHARS = 8  # fewer visible characters than this: the page has no usable text layer
# a PDF point is 1/72 inch; a page image written at its pixel size (Pillow's and image_pdf's default,
# 72 dpi) has one pixel per point, so a page renders at no less than this and its pixels come back
MIN_PIXELS_PER_POINT = 1.0


def fail(msg: str) -> None:
    sys.stdout.write(json.dumps({"error": msg}))
    sys.exit(0)


def pixels_per_point(page, pdfium) -> float:  # noqa: ANN001 - a pypdfium2 page and the module
    """The page's own resolution: the densest image drawn on it (its pixels over the points it covers,
    so a 300-dpi scan gives 300/72), never below ``MIN_PIXELS_PER_POINT`` (a page without images)."""
    best = MIN_PIXELS_PER_POINT
    try:
        for obj in page.get_objects(filter=(pdfium.raw.FPDF_PAGEOBJ_IMAGE,), max_depth=2):
            left, bottom, right, top = obj.get_bounds()
            pw, ph = obj.get_px_size()
            if right - left > 0 and top - bottom > 0:
                best = max(best, pw / (right - left), ph / (top - bottom))
    except pdfium.PdfiumError:  # an image pdfium cannot measure: the page renders at 72 dpi
        return MIN_PIXELS_PER_POINT
    return best


def render(raw: bytes, indices: list[int], side: int) -> dict[str, str]:
    """Pages ``indices`` as PNGs at the page's own resolution (``pixels_per_point``), scaled down so
    the longer side is at most ``side`` pixels, never enlarged past its own resolution; aspect kept
    (pypdfium2 rounds each side to whole pixels)."""
    import pypdfium2 as pdfium

    out = {}
    pdf = pdfium.PdfDocument(raw)
    try:
        for i in indices:
            page = pdf[i]
            w, h = page.get_size()  # points
            scale = min(pixels_per_point(page, pdfium), side / max(w, h, 1.0))
            img = page.render(scale=scale).to_pil().convert("RGB")
            buf = io.BytesIO()
            img.save(buf, format="PNG")
            out[str(i)] = base64.b64encode(buf.getvalue()).decode()
            page.close()
    finally:
        pdf.close()
    return out


def page_bytes(page) -> int:  # noqa: ANN001 - a pypdf PageObject
    """What a page decodes to: its content streams (decoded, each within pypdf's caps) plus its
    images' declared ``width x height x 4`` (never decoded here: a renderer would)."""
    contents = page.get_contents()
    n = len(contents.get_data()) if contents is not None else 0
    res = page.get("/Resources")
    res = res.get_object() if res is not None else {}
    xobjects = res.get("/XObject") if hasattr(res, "get") else None
    for ref in xobjects.get_object().values() if xobjects is not None else []:
        x = ref.get_object()
        if x.get("/Subtype") == "/Image":
            n += int(x.get("/Width", 0)) * int(x.get("/Height", 0)) * 4
    return n


def limit_self(opts: dict) -> None:
    """The kernel's caps on this process: address space and CPU seconds (a bomb dies, not the server)."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (opts["max_memory"], opts["max_memory"]))
    resource.setrlimit(resource.RLIMIT_CPU, (opts["max_cpu"], opts["max_cpu"] + 1))


def main() -> None:
    opts = json.loads(sys.argv[1])
    limit_self(opts)
    raw = sys.stdin.buffer.read()
    try:
        import pypdf
        from pypdf.errors import LimitReachedError, PdfReadError
    except ImportError:
        fail("PDF support needs pypdf and pypdfium2 on the server (pip install 'longmoe[documents]')")

    # pypdf's own caps on what a stream may inflate to (its Configuration, pypdf >= 6.x): the budget
    cap = opts["max_decompressed"]
    names = ("zlib", "lzw", "run_length", "jbig2", "brotli")
    pypdf.overwrite_configuration(
        **{f"{n}_maximum_output_length": cap for n in names},
        maximum_declared_stream_length=cap,
        array_based_stream_maximum_output_length=cap,
        image_maximum_buffer_size=cap,
        page_tree_maximum_page_entries=opts["max_pages"] + 1,
    )
    try:
        reader = pypdf.PdfReader(io.BytesIO(raw), strict=False)
        encrypted = reader.is_encrypted
        if encrypted and not reader.decrypt(""):  # an empty user password opens many "protected" PDFs
            fail("the PDF is encrypted with a password; send it decrypted")
        n = len(reader.pages)
    except LimitReachedError as e:
        fail(f"the PDF exceeds a parsing budget ({str(e)[:160]})")
    except PdfReadError as e:
        fail(f"not a readable PDF ({str(e)[:160]})")
    except Exception as e:  # noqa: BLE001 - any parser failure is the file's fault
        fail(f"not a readable PDF ({type(e).__name__}: {str(e)[:160]})")
    if n == 0:
        fail("the PDF has no pages")
    if n > opts["max_pages"]:
        fail(f"the PDF has {n} pages, more than the limit of {opts['max_pages']}")
    inflated = 0  # bytes the document's page contents and images decode to: the budget covers both
    for i in range(n):
        try:
            inflated += page_bytes(reader.pages[i])
        except LimitReachedError as e:
            fail(f"page {i + 1} exceeds a parsing budget ({str(e)[:160]})")
        except Exception as e:  # noqa: BLE001
            fail(f"page {i + 1} could not be read ({type(e).__name__}: {str(e)[:160]})")
        if inflated > opts["max_decompressed"]:
            fail(f"the PDF inflates to more than the limit of {opts['max_decompressed']} bytes (a PDF bomb?)")
    pages: list[str] = []
    chars = 0
    mode = opts["pages_as"]
    for i in range(n):
        text = ""
        if mode != "images":
            try:
                text = reader.pages[i].extract_text() or ""
            except Exception as e:  # noqa: BLE001
                fail(f"page {i + 1} could not be read ({type(e).__name__}: {str(e)[:160]})")
        text = text.replace("\x00", "").strip("\n")
        chars += len(text)
        if chars > opts["max_chars"]:
            fail(f"the PDF's text exceeds the limit of {opts['max_chars']} characters")
        pages.append(text)
    want = [i for i, t in enumerate(pages) if len(t.strip()) < MIN_TEXT_CHARS] if mode != "text" else []
    if len(want) > opts["render"]:
        fail(
            f"{len(want)} pages need rendering (no text layer), more than the limit of {opts['render']} "
            "page images per document"
        )
    try:
        images = render(raw, want, opts["render_side"]) if want else {}
    except Exception as e:  # noqa: BLE001
        fail(f"the PDF's pages could not be rendered ({type(e).__name__}: {str(e)[:160]})")
    sys.stdout.write(json.dumps({"pages": pages, "images": images, "encrypted": encrypted}))


if __name__ == "__main__":
    main()
