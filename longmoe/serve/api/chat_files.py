"""File content parts of a chat request become one document message at the start of the prompt.

``{"type": "file", "file": {"file_id": ...}}`` names an uploaded file of the caller's key (another
key's id is a 404); ``{"type": "file", "file": {"file_data": "data:application/pdf;base64,...",
"filename": ...}}`` carries it inline (parsed like an upload, within the request body limit). Every
document of the request goes, in order, into one message placed first: ``PREAMBLE`` then each
document's text (``Document.block``). A text model gets it as a ``system`` message; when a vision
model has page images to read, a ``user`` message whose image parts follow the text. The message
is placed first so that it is the prompt's prefix: a second question about the same file (in this
or another conversation of the same key) reuses its prefix snapshot, reported as
``usage.prompt_tokens_details.cached_tokens``.

Prefix state is salted (``Engine.submit(cache_salt=...)``) by the key's owner when the server has
several keys, and by the ids of the uploaded files the prompt holds, so deleting a file drops the
snapshots of questions about it (``FileService.delete``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

from longmoe.serve.api.errors import APIError
from longmoe.serve.api.security import KeyRing
from longmoe.serve.api.state import ServerState
from longmoe.serve.files.documents import Document, DocumentError, parse
from longmoe.serve.files.service import FileError
from longmoe.serve.images import to_data_uri

PREAMBLE = (
    "The user attached the documents below. Answer questions about them from their text; "
    "PDF pages are marked '--- page N ---'.\n\n"
)
_DATA_URI = re.compile(r"^data:([^,;]*)((?:;[^,;]*)*),", re.IGNORECASE)
NO_VISION = (
    "has no text layer (only page images) and this model reads text only (its config has no "
    "'vision'); send a PDF with a text layer, or use a vision model"
)


def _inline(st: ServerState, f: dict, param: str) -> Document:
    url = f.get("file_data") or ""
    m = _DATA_URI.match(url)
    if m is None or "base64" not in m.group(2).lower():
        raise APIError(400, f"{param}.file_data: expected a data URI: data:application/pdf;base64,...", param)
    try:
        raw = base64.b64decode(url[m.end() :], validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{param}.file_data: invalid base64 (is the data truncated?)", param) from None
    limits = st.files.limits if st.files is not None else None
    try:
        return parse(
            raw, f.get("filename") or "document", m.group(1) or None, limits, f.get("pages_as") or "auto"
        )
    except DocumentError as e:
        raise APIError(e.status, f"{param}: {e}", param, "invalid_file") from None


def attach_documents(st: ServerState, owner: str, messages: list[dict]) -> tuple[list[dict], bytes | None]:
    """``messages`` with their file parts taken out and their documents in one message in front,
    and the prefix-cache salt of the request (None: unsalted). 4xx naming the part on any refusal."""
    vision = st.engine.model.cfg.vision is not None
    docs: list[Document] = []
    file_ids: list[str] = []
    out = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list) or not any(p.get("type") == "file" for p in content):
            out.append(m)
            continue
        kept = []
        for j, part in enumerate(content):
            if part.get("type") != "file":
                kept.append(part)
                continue
            param = f"messages.{i}.content.{j}.file"
            f = part.get("file") or {}
            if m.get("role") != "user":
                raise APIError(400, f"{param}: files are allowed in user messages only", param)
            if bool(f.get("file_id")) == bool(f.get("file_data")):
                raise APIError(400, f"{param}: give exactly one of file_id or file_data", param)
            if f.get("file_id"):
                if st.files is None:
                    raise APIError(
                        400, f"{param}: the Files API is off on this server; send file_data", param
                    )
                if f.get("pages_as"):
                    raise APIError(400, f"{param}.pages_as: only with file_data", param)
                try:
                    _, doc = st.files.document(owner, f["file_id"])
                except FileError as e:
                    raise APIError(e.status, f"{param}.file_id: {e}", f"{param}.file_id", e.code) from None
                file_ids.append(f["file_id"])
            else:
                doc = _inline(st, f, param)
            if not vision and doc.images and not doc.text_pages:
                what = "the image" if doc.kind == "image" else "the PDF"
                raise APIError(400, f"{param}: {what} {NO_VISION}", param, "unsupported_file")
            docs.append(doc)
        out.append({**m, "content": kept or ""})
    if not docs:
        return messages, _salt(st, owner, [])
    text = PREAMBLE + "".join(d.block(with_images=vision) for d in docs)
    images = [to_data_uri(raw) for d in docs if vision for _, raw in sorted(d.images.items())]
    if images:
        parts = [
            {"type": "text", "text": text},
            *({"type": "image_url", "image_url": {"url": u}} for u in images),
        ]
        lead = {"role": "user", "content": parts}
    else:
        lead = {"role": "system", "content": text}
    salt = _salt(st, owner, file_ids)
    if st.files is not None and salt is not None:
        for fid in file_ids:
            st.files.used_salt(fid, salt)
    return [lead, *out], salt


def _salt(st: ServerState, owner: str, file_ids: list[str]) -> bytes | None:
    parts = ([owner] if isinstance(st.config.api_key, KeyRing) else []) + sorted(set(file_ids))
    if not parts:
        return None
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=16, person=b"longmoe-salt").digest()
