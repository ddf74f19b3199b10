"""The Files API's logic apart from HTTP: files per owner (an API key) in an ``ObjectStore``, quotas,
the parsed document stored beside each file, and which prefix-cache salts a file's questions used
(so deleting the file can drop its snapshots).

Objects of owner ``o``: ``o/file-<hex>`` (the bytes as uploaded, metadata = the file object) and
``o/file-<hex>.doc`` (the parsed ``Document`` as JSON, rendered pages as base64 PNG). An owner sees
only its own keys: another owner's file id is simply not found.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from longmoe.serve.files.documents import Document, DocumentError, DocumentLimits, parse_file
from longmoe.serve.files.store import ObjectStore

FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
PURPOSES = ("assistants", "user_data", "batch", "fine-tune", "vision", "evals")


@dataclass(frozen=True)
class FileQuota:
    """Per owner (API key): files and stored bytes; per upload: bytes (validated)."""

    max_files: int = 100
    max_bytes: int = 512 << 20
    max_file_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for f in ("max_files", "max_bytes", "max_file_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected an integer >= 1, got {v!r}")


class FileError(Exception):
    """A Files API refusal: ``status`` (404, 409, 413, 400, ...) and a one-line message."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class FileService:
    store: ObjectStore
    count_tokens: Callable[[Document], int]  # the document's tokens in a prompt (text and page images)
    quota: FileQuota = field(default_factory=FileQuota)
    limits: DocumentLimits = field(default_factory=DocumentLimits)
    forget: Callable[[bytes], int] | None = None  # drops the prefix snapshots under a salt
    salts: dict[str, set[bytes]] = field(default_factory=dict)  # file id -> salts its questions used
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self, owner: str, src: Path, size: int, sha256: str, filename: str, purpose: str,
               mime: str | None) -> dict:  # fmt: skip
        """Parse (streamed from ``src``), check the quota, then store the file and its document; the
        file object."""
        if purpose not in PURPOSES:
            raise FileError(400, f"purpose: expected one of {', '.join(PURPOSES)}", "invalid_value")
        try:
            doc = parse_file(src, filename, mime, self.limits)
        except DocumentError as e:
            raise FileError(e.status, f"file: {e}", "invalid_file") from None
        with self._lock:  # quota check and store as one step: two uploads cannot both squeeze in
            mine = self.list(owner)
            if len(mine) >= self.quota.max_files:
                raise FileError(403, f"file quota reached ({self.quota.max_files} files per key)", "quota")
            used = sum(int(m.get("bytes", 0)) for m in mine)
            if used + size > self.quota.max_bytes:
                msg = f"storage quota reached ({used} + {size} bytes > {self.quota.max_bytes} per key)"
                raise FileError(403, msg, "quota")
            fid = f"file-{secrets.token_hex(12)}"
            obj = {
                "id": fid,
                "object": "file",
                "bytes": size,
                "created_at": int(time.time()),
                "filename": filename,
                "purpose": purpose,
                "status": "processed",
                "status_details": None,
                "expires_at": None,
                "sha256": sha256,
                "kind": doc.kind,
                "pages": len(doc.pages),
                "text_pages": doc.text_pages,
                "image_pages": len(doc.images),
                "tokens": self.count_tokens(doc),
            }
            payload = {
                **doc.to_json(),
                "images": {str(k): base64.b64encode(v).decode() for k, v in doc.images.items()},
            }
            raw = json.dumps(payload).encode()
            self.store.put_bytes(
                f"{owner}/{fid}.doc", raw, {"derived": fid, "sha256": hashlib.sha256(raw).hexdigest()}
            )
            self.store.put(f"{owner}/{fid}", src, obj)  # the file object last: visible only when whole
        return obj

    def _meta(self, owner: str, fid: str) -> dict:
        meta = self.store.meta(f"{owner}/{fid}") if FILE_ID.match(fid) else None
        if meta is None or meta.get("object") != "file":
            raise FileError(404, f"no file with id '{fid[:64]}'", "file_not_found")
        return meta

    def get(self, owner: str, fid: str) -> dict:
        return self._public(self._meta(owner, fid))

    def list(self, owner: str) -> list[dict]:
        return [self._public(m) for m in self.store.list(owner) if m.get("object") == "file"]

    def content(self, owner: str, fid: str) -> bytes:
        self._meta(owner, fid)
        return self.store.read(f"{owner}/{fid}")

    def document(self, owner: str, fid: str) -> tuple[dict, Document]:
        meta = self._meta(owner, fid)
        d = json.loads(self.store.read(f"{owner}/{fid}.doc"))
        images = {int(k): base64.b64decode(v) for k, v in d["images"].items()}
        return meta, Document(d["kind"], d["name"], d["pages"], images)

    def used_salt(self, fid: str, salt: bytes) -> None:
        with self._lock:
            self.salts.setdefault(fid, set()).add(salt)

    def delete(self, owner: str, fid: str) -> dict:
        """Remove the file, its document and the prefix snapshots of questions about it."""
        self._meta(owner, fid)
        self.store.delete(f"{owner}/{fid}")  # the file object first: never half-visible
        self.store.delete(f"{owner}/{fid}.doc")
        with self._lock:
            salts = self.salts.pop(fid, set())
        for s in salts:
            if self.forget is not None:
                self.forget(s)
        return {"id": fid, "object": "file", "deleted": True}

    @staticmethod
    def _public(meta: dict) -> dict:
        return {k: v for k, v in meta.items() if k != "sha256"}
