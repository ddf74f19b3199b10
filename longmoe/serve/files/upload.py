"""A ``multipart/form-data`` upload streamed to a temporary file: the bytes go to disk as they arrive
(never held whole in memory), hashed on the way, and the upload is cut the moment the file part
passes its size limit. Whatever ends it early (too large, too slow, malformed, the client gone)
deletes the temporary file: nothing partial is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path


def _multipart():  # noqa: ANN202 - imported on first upload: the extra ``longmoe[documents]``
    try:
        from python_multipart import multipart
    except ImportError:
        raise UploadError(
            501, "file uploads need python-multipart (pip install 'longmoe[documents]')"
        ) from None
    return multipart


MAX_FIELD_BYTES = 256  # a form field other than the file (``purpose``)
MAX_PARTS = 8
MAX_HEADER_BYTES = 4096  # per part


class UploadError(Exception):
    """``status`` and a one-line reason (413 too large, 408 too slow, 400 malformed or cut off)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Upload:
    path: Path | None = None  # the file part on disk (None: no file part)
    size: int = 0
    sha256: str = ""
    filename: str | None = None
    content_type: str | None = None
    fields: dict[str, str] = field(default_factory=dict)

    def discard(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None


def boundary_of(content_type: str) -> bytes:
    ctype, params = _multipart().parse_options_header(content_type)
    if ctype != b"multipart/form-data" or not params.get(b"boundary"):
        raise UploadError(415, "Content-Type must be multipart/form-data with a boundary")
    b = params[b"boundary"]
    if len(b) > 200:
        raise UploadError(400, "multipart boundary longer than 200 bytes")
    return b


class _Receiver:
    """The parser's callbacks: headers per part, the file part to disk, small fields to memory."""

    def __init__(self, spool: Path, max_file_bytes: int) -> None:
        self.spool, self.max_file_bytes = spool, max_file_bytes
        self.up = Upload()
        self._hash = hashlib.sha256()
        self._file = None
        self._parts = 0
        self._hname, self._hval = b"", b""
        self._headers: dict[bytes, bytes] = {}
        self._header_bytes = 0
        self._name: str | None = None
        self._buf = bytearray()

    def callbacks(self) -> dict:
        return {
            "on_part_begin": self._begin,
            "on_header_field": lambda d, s, e: self._hdr("_hname", d[s:e]),
            "on_header_value": lambda d, s, e: self._hdr("_hval", d[s:e]),
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_done,
            "on_part_data": self._data,
            "on_part_end": self._end,
        }

    def _begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise UploadError(400, f"more than {MAX_PARTS} form parts")
        self._headers, self._header_bytes, self._name = {}, 0, None
        self._hname, self._hval = b"", b""

    def _hdr(self, which: str, data: bytes) -> None:
        self._header_bytes += len(data)
        if self._header_bytes > MAX_HEADER_BYTES:
            raise UploadError(400, f"form part headers longer than {MAX_HEADER_BYTES} bytes")
        setattr(self, which, getattr(self, which) + data)

    def _header_end(self) -> None:
        self._headers[self._hname.strip().lower()] = self._hval.strip()
        self._hname, self._hval = b"", b""

    def _headers_done(self) -> None:
        _, opts = _multipart().parse_options_header(self._headers.get(b"content-disposition", b""))
        name = opts.get(b"name")
        if name is None:
            raise UploadError(400, "a form part has no name (Content-Disposition: form-data; name=...)")
        self._name = name.decode("utf-8", "replace")
        if self._name == "file":
            if self._file is not None:
                raise UploadError(400, "more than one 'file' part")
            fn = opts.get(b"filename")
            if fn is None:
                raise UploadError(400, "the 'file' part has no filename")
            try:
                self.up.filename = fn.decode("utf-8")
            except UnicodeDecodeError:
                raise UploadError(400, "file name is not UTF-8") from None
            ct = self._headers.get(b"content-type")
            self.up.content_type = ct.decode("latin-1") if ct else None
            fd, tmp = tempfile.mkstemp(prefix=".upload-", dir=self.spool)
            self.up.path = Path(tmp)
            self._file = os.fdopen(fd, "wb")
        else:
            self._buf = bytearray()

    def _data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if self._name == "file" and self._file is not None and not self._file.closed:
            self.up.size += len(chunk)
            if self.up.size > self.max_file_bytes:
                raise UploadError(413, f"file exceeds the limit of {self.max_file_bytes} bytes")
            self._hash.update(chunk)
            self._file.write(chunk)
        else:
            self._buf += chunk
            if len(self._buf) > MAX_FIELD_BYTES:
                raise UploadError(
                    400, f"form field '{(self._name or '')[:40]}' longer than {MAX_FIELD_BYTES} bytes"
                )

    def _end(self) -> None:
        if self._name == "file" and self._file is not None:
            self._file.close()
            self.up.sha256 = self._hash.hexdigest()
        elif self._name is not None:
            if self._name in self.up.fields:
                raise UploadError(400, f"form field '{self._name[:40]}' given twice")
            self.up.fields[self._name] = self._buf.decode("utf-8", "replace")

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()


async def receive(
    stream: AsyncIterator[bytes], content_type: str, spool: Path, max_file_bytes: int, timeout_s: float
) -> Upload:
    """The upload from the body ``stream`` (see the module docstring); ``UploadError`` otherwise.
    A disconnect (``ClientDisconnect``) propagates after the temporary file is deleted."""
    rx = _Receiver(spool, max_file_bytes)
    parser = _multipart().MultipartParser(boundary_of(content_type), rx.callbacks())
    ok = False
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in stream:
                if chunk:
                    parser.write(chunk)
        parser.finalize()
        if rx.up.path is None or not rx.up.sha256:
            raise UploadError(400, "no complete 'file' part in the form (was the upload cut off?)")
        ok = True
        return rx.up
    except TimeoutError:
        raise UploadError(408, f"upload not received within {timeout_s:g} s") from None
    except UploadError:
        raise
    except (ValueError, Exception) as e:  # the parser's own errors: malformed multipart
        if type(e).__name__ == "ClientDisconnect":
            raise
        raise UploadError(400, f"malformed multipart body ({type(e).__name__})") from None
    finally:
        rx.close()
        if not ok:
            rx.up.discard()
