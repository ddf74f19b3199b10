"""What an uploaded file becomes in a prompt (docs/serve.md, "Documents").

- **PDF**: the text layer of every page through ``pypdf``, each page after a ``--- page N ---``
  marker; a page with (almost) no text layer, or every page when asked (``pages_as="images"``), is
  rendered through ``pypdfium2`` to a PNG at the page's own resolution (its densest image's pixels
  per point, for a scan; one pixel per point, 72 dpi, at least), shrunk to at most ``render_side``
  pixels on its longer side, never enlarged, which a vision model reads as image patches
  (``serve/images.py``) after the document's text. So a page written from a page image comes back
  as that image's pixels (up to ``render_side``), and the model's own resize rule then treats it as
  it treats the image.
- **Text** (plain, Markdown, source code, CSV, JSON): the UTF-8 text as it is, one "page".
- **Images** (PNG, JPEG, WebP, GIF): one page image.

Every file is checked before it is parsed: the bytes' signature decides the kind, and a declared
media type or a file name extension that disagrees is refused; archives (zip, gzip, ...) are refused.
PDFs are parsed in a child process (``parse_worker.py``) under the per-document budget
``DocumentLimits``: wall time, pages, bytes any one stream may inflate to, characters of text, page
images, and the child's address space and CPU time, so a PDF bomb costs at most the budget and
nothing survives it. Every refusal is a ``DocumentError`` with a one-line reason.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from longmoe.serve.images import sniff_format

WORKER = Path(__file__).with_name("parse_worker.py")
ARCHIVES = (  # signatures of compressed containers: never unpacked, refused
    (b"PK\x03\x04", "zip"),
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"7z\xbc\xaf\x27\x1c", "7z"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
TEXT_EXTENSIONS = {
    ".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".json", ".jsonl", ".xml", ".html", ".htm",
    ".yaml", ".yml", ".toml", ".ini", ".log", ".py", ".js", ".ts", ".c", ".h", ".cc", ".cpp", ".hpp",
    ".rs", ".go", ".java", ".kt", ".rb", ".sh", ".sql", ".tex", ".css", "",
}  # fmt: skip
IMAGE_EXTENSIONS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".gif": "GIF"}
PAGES_AS = ("auto", "text", "images")
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f/\\]")
MAX_NAME = 255


class DocumentError(ValueError):
    """A file refused (the reason is the message); ``status``: the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class DocumentLimits:
    """The per-document budget (validated); the defaults are the server's (docs/serve.md)."""

    max_seconds: float = 30.0  # wall time of parsing one PDF (the child is killed past it)
    max_pages: int = 2000
    max_decompressed: int = 256 << 20  # bytes any one PDF stream may inflate to
    max_chars: int = 4_000_000  # characters of text per document (about 1M tokens)
    max_rendered_pages: int = 4  # page images per document
    render_side: int = 1024  # pixels, most on the longer side of a rendered page (never enlarged)
    max_memory: int = 2 << 30  # address space of the parsing child, bytes

    def __post_init__(self) -> None:
        for f in ("max_pages", "max_decompressed", "max_chars", "max_rendered_pages", "render_side",
                  "max_memory", "max_seconds"):  # fmt: skip
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ValueError(f"{f}: expected a number > 0, got {v!r}")


@dataclass
class Document:
    kind: str  # "pdf" | "text" | "image"
    name: str
    pages: list[str]  # text per page (a text file: one page; an image: one empty page)
    images: dict[int, bytes] = field(default_factory=dict)  # page index -> image file bytes

    @property
    def text_pages(self) -> int:
        return sum(1 for t in self.pages if t.strip())

    def block(self, with_images: bool = True) -> str:
        """The document as prompt text: ``<document name=... pages=N>``, pages, ``</document>``;
        ``with_images``: its page images follow it in the prompt (a vision model)."""
        name = self.name.replace('"', "'")
        out = [f'<document name="{name}" pages="{len(self.pages)}">\n']
        for i, t in enumerate(self.pages):
            if self.kind == "pdf":
                out.append(f"--- page {i + 1} ---\n")
            body = t.strip("\n")
            if not body.strip():
                body = "[page image below]" if with_images and i in self.images else "[no text on this page]"
            out.append(body + "\n")
        out.append("</document>\n")
        return "".join(out)

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "pages": self.pages}


def check_filename(name: str) -> str:
    """The client's file name, or ``DocumentError``: no path separators, control characters, ``..``."""
    if not name or name in (".", "..") or len(name.encode()) > MAX_NAME:
        raise DocumentError(f"file name must be 1-{MAX_NAME} bytes and not '.' or '..'")
    if _BAD_NAME.search(name):
        raise DocumentError("file name must not contain path separators or control characters")
    return name


def sniff_kind(raw: bytes, name: str, declared: str | None) -> str:
    """``pdf`` | ``image`` | ``text`` from the bytes; a declared type or extension that disagrees,
    an archive, or binary data is a ``DocumentError``."""
    if not raw:
        raise DocumentError("the file is empty")
    for sig, what in ARCHIVES:
        if raw.startswith(sig):
            raise DocumentError(f"{what} archives are not accepted; send the documents themselves")
    if b"%PDF-" in raw[:1024]:
        kind = "pdf"
    elif sniff_format(raw) is not None:
        kind = "image"
    else:
        kind = "text"
    ext = os.path.splitext(name)[1].lower()
    by_ext = "pdf" if ext == ".pdf" else "image" if ext in IMAGE_EXTENSIONS else "text"
    if ext and (ext == ".pdf" or ext in IMAGE_EXTENSIONS or ext in TEXT_EXTENSIONS) and by_ext != kind:
        raise DocumentError(f"the file name says {ext} but the data is {_a(kind)}")
    d = (declared or "").split(";")[0].strip().lower()
    if d and d != "application/octet-stream":
        want = "pdf" if d == "application/pdf" else "image" if d.startswith("image/") else None
        if want is None and (d.startswith("text/") or d in ("application/json", "application/x-ndjson")):
            want = "text"
        if want is None:
            raise DocumentError(f"unsupported media type '{d[:60]}' (PDF, text, JSON or an image)")
        if want != kind:
            raise DocumentError(f"declared {d[:60]} but the data is {_a(kind)}")
    return kind


def _a(kind: str) -> str:
    return {"pdf": "a PDF", "image": "an image", "text": "text"}[kind]


def parse(
    raw: bytes,
    name: str,
    declared: str | None = None,
    limits: DocumentLimits | None = None,
    pages_as: str = "auto",
) -> Document:
    """The document ``raw`` holds (see the module docstring); ``DocumentError`` when refused."""
    limits = limits or DocumentLimits()
    if pages_as not in PAGES_AS:
        raise DocumentError(f"pages_as: expected one of {', '.join(PAGES_AS)}, got {pages_as[:20]!r}")
    name = check_filename(name)
    kind = sniff_kind(raw, name, declared)
    if kind == "image":
        return Document("image", name, [""], {0: raw})
    if kind == "text":
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise DocumentError(
                f"not UTF-8 text (byte {e.start}); send PDF, UTF-8 text or an image"
            ) from None
        if "\x00" in text:
            raise DocumentError("the file holds NUL bytes: binary data, not text")
        if len(text) > limits.max_chars:
            raise DocumentError(f"the text exceeds the limit of {limits.max_chars} characters")
        return Document("text", name, [text])
    return _parse_pdf(raw, name, limits, pages_as)


def parse_file(
    path: Path, name: str, declared: str | None = None, limits: DocumentLimits | None = None
) -> Document:
    """``parse`` of an uploaded file on disk: a PDF streams from the file into the parsing child (the
    server never holds it whole); text is read only when its size can fit ``max_chars``."""
    limits = limits or DocumentLimits()
    with open(path, "rb") as f:
        head = f.read(4096)
    size = path.stat().st_size
    if b"%PDF-" not in head[:1024] or size <= len(head):
        if b"%PDF-" not in head[:1024] and sniff_format(head) is None and size > 4 * limits.max_chars:
            check_filename(name)
            sniff_kind(head, name, declared)
            raise DocumentError(f"the text exceeds the limit of {limits.max_chars} characters")
        return parse(path.read_bytes(), name, declared, limits)
    check_filename(name)
    sniff_kind(head, name, declared)
    with open(path, "rb") as f:
        return _parse_pdf(f, name, limits, "auto")


def _parse_pdf(raw: bytes | BinaryIO, name: str, limits: DocumentLimits, pages_as: str) -> Document:
    opts = {
        "pages_as": pages_as,
        "max_pages": limits.max_pages,
        "max_chars": limits.max_chars,
        "max_decompressed": limits.max_decompressed,
        "render": limits.max_rendered_pages,
        "render_side": limits.render_side,
        "max_memory": limits.max_memory,
        "max_cpu": int(limits.max_seconds) + 1,
    }
    cmd = [sys.executable, "-s", str(WORKER), json.dumps(opts)]
    feed = {"input": raw} if isinstance(raw, bytes) else {"stdin": raw}
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=limits.max_seconds, check=False, **feed)
    except subprocess.TimeoutExpired:
        raise DocumentError(
            f"parsing the PDF took longer than the limit of {limits.max_seconds:g} s"
        ) from None
    if p.returncode != 0:
        if p.returncode < 0 or b"MemoryError" in p.stderr:
            raise DocumentError("parsing the PDF exceeded the memory or CPU budget (a PDF bomb?)")
        raise DocumentError(f"the PDF could not be parsed (exit {p.returncode})")
    try:
        out = json.loads(p.stdout)
    except ValueError:
        raise DocumentError("the PDF could not be parsed (no result)") from None
    if "error" in out:
        raise DocumentError(out["error"])
    images = {int(k): base64.b64decode(v) for k, v in out["images"].items()}
    return Document("pdf", name, list(out["pages"]), images)
