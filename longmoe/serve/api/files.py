"""OpenAI's Files API: ``POST /v1/files`` (multipart: ``file`` and ``purpose``), ``GET /v1/files``,
``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``.

A file belongs to the API key that uploaded it (``--api-keys FILE``: several keys): another key
gets 404 for it and its list shows only its own. The upload streams to disk and is cut at the
per-file limit (``serve/files/upload.py``); the file is parsed (``serve/files/documents.py``) before
it is stored, so a file that would fail in a chat fails here, with a 4xx naming the reason. The file
object carries longmoe's extras: ``kind``, ``pages``, ``text_pages``, ``image_pages`` and
``tokens`` (what the document adds to a prompt).
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from longmoe.serve.api.errors import APIError, echo
from longmoe.serve.api.security import check_key
from longmoe.serve.api.state import ServerState, server_state
from longmoe.serve.files.service import FileError, FileService
from longmoe.serve.files.upload import UploadError, receive

MULTIPART_OVERHEAD = 64 * 1024  # form fields and part headers beside the file's bytes
UPLOAD_TIMEOUT_S = 300.0


def _service(request: Request) -> tuple[ServerState, FileService, str]:
    st = server_state(request)
    owner = check_key(request, st.config.api_key)
    if st.files is None:
        raise APIError(404, "the Files API is off on this server (start it with --files-dir or --files-s3)")
    return st, st.files, owner


def _fail(e: FileError) -> APIError:
    param = "file" if e.code == "invalid_file" else "purpose" if str(e).startswith("purpose") else None
    return APIError(e.status, str(e), param, e.code)


async def create_file(request: Request) -> Response:
    st, svc, owner = _service(request)
    limit = svc.quota.max_file_bytes
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > limit + MULTIPART_OVERHEAD:
        raise APIError(
            413, f"upload of {echo(n)} bytes exceeds the limit of {limit} bytes", "file", close=True
        )
    assert st.spool is not None
    try:
        up = await receive(request.stream(), request.headers.get("content-type", ""), st.spool, limit,
                           max(UPLOAD_TIMEOUT_S, st.config.body_timeout_s))  # fmt: skip
    except UploadError as e:
        code = {413: "file_too_large", 408: "body_timeout", 415: "unsupported_media_type"}.get(e.status)
        raise APIError(e.status, str(e), "file", code, close=True) from None
    except ClientDisconnect:
        raise APIError(400, "client disconnected while uploading", "file", close=True) from None
    request.state.body_read = True
    try:
        purpose = up.fields.get("purpose")
        if purpose is None:
            raise APIError(400, "purpose: required form field", "purpose", "invalid_value")
        assert up.path is not None and up.filename is not None
        try:
            obj = await asyncio.to_thread(
                svc.create, owner, up.path, up.size, up.sha256, up.filename, purpose, up.content_type
            )
        except FileError as e:
            raise _fail(e) from None
    finally:
        up.discard()
    return JSONResponse(obj)


async def list_files(request: Request) -> Response:
    _, svc, owner = _service(request)
    purpose = request.query_params.get("purpose")
    files = await asyncio.to_thread(svc.list, owner)
    data = [f for f in files if purpose is None or f.get("purpose") == purpose]
    data.sort(key=lambda f: f.get("created_at", 0), reverse=True)
    return JSONResponse({"object": "list", "data": data, "has_more": False})


async def retrieve_file(request: Request) -> Response:
    _, svc, owner = _service(request)
    try:
        return JSONResponse(await asyncio.to_thread(svc.get, owner, request.path_params["file_id"]))
    except FileError as e:
        raise _fail(e) from None


async def file_content(request: Request) -> Response:
    _, svc, owner = _service(request)
    try:
        data = await asyncio.to_thread(svc.content, owner, request.path_params["file_id"])
    except FileError as e:
        raise _fail(e) from None
    return Response(data, media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    _, svc, owner = _service(request)
    try:
        return JSONResponse(await asyncio.to_thread(svc.delete, owner, request.path_params["file_id"]))
    except FileError as e:
        raise _fail(e) from None
