"""Reading an API request body safely: key and media type first, the size checked before any
parsing (``Content-Length`` and the bytes as they stream in), a deadline on the whole body, then
JSON parsing that turns every hostile shape into a 400 naming the field.

Parsing runs in a worker thread (a 1 MB body must not stall the event loop). The JSON is parsed
with hooks that keep oversized integers, ``NaN``/``Infinity`` and overflowing floats as markers,
then one walk over the tree rejects them, lone UTF-16 surrogates (in keys too) and nesting deeper
than ``MAX_DEPTH``, each with its path (``messages.0.content``); only then does pydantic see it.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import TypeVar

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request

from longmoe.serve.api.errors import APIError, echo, validation_error
from longmoe.serve.api.protocol import GenerationRequest, model_not_found
from longmoe.serve.api.security import check_json, check_key
from longmoe.serve.api.state import server_state

MAX_DEPTH = 32  # nesting of JSON objects/arrays; requests need about 5
MAX_INT_DIGITS = 20  # every integer field fits in 64 bits

M = TypeVar("M", bound=GenerationRequest)


class _Oversized(str):
    """An integer literal too long to be a field value (kept as its text until the walk)."""


class _NonFinite(str):
    """``NaN``, ``Infinity`` or a float literal that overflows to infinity."""


def _parse_int(s: str) -> int | _Oversized:
    return int(s) if len(s.lstrip("-")) <= MAX_INT_DIGITS else _Oversized(s)


def _parse_float(s: str) -> float | _NonFinite:
    v = float(s)
    return v if math.isfinite(v) else _NonFinite(s)


def parse_json(raw: bytes) -> object:
    """The body as JSON values, or a 400 naming the field at fault."""
    try:
        data = json.loads(raw, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_NonFinite)
    except RecursionError:  # far deeper than MAX_DEPTH: find the field without the parser
        _reject(_deep_field(raw.decode("utf-8", errors="replace")), f"nested deeper than {MAX_DEPTH} levels")
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise APIError(400, f"invalid JSON body: {echo(str(e), 200)}", None, "invalid_json") from None
    _check_tree(data)
    return data


def _check_tree(data: object) -> None:
    stack: list[tuple[object, tuple[str, ...]]] = [(data, ())]
    while stack:
        v, path = stack.pop()
        if len(path) > MAX_DEPTH:
            _reject(path[:1], f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(v, _Oversized):
            _reject(path, f"integer with {len(v.lstrip('-'))} digits (at most {MAX_INT_DIGITS})")
        elif isinstance(v, _NonFinite):
            _reject(path, f"expected a finite number, got {echo(v, 16)}")
        elif isinstance(v, str):
            if not v.isascii() and not _encodable(v):
                _reject(path, "string contains a lone UTF-16 surrogate (not valid Unicode)")
        elif isinstance(v, dict):
            for k, x in v.items():
                if not k.isascii() and not _encodable(k):
                    _reject(path, "a key contains a lone UTF-16 surrogate (not valid Unicode)")
                stack.append((x, (*path, k)))
        elif isinstance(v, list):
            stack.extend((x, (*path, str(i))) for i, x in enumerate(v))


def _deep_field(text: str) -> tuple[str, ...]:
    """The top-level key under which ``text`` first nests deeper than ``MAX_DEPTH`` (a scan that
    stops there; used only when the parser gave up)."""
    depth, key, last, i = 0, (), "", 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = _string_end(text, i)
            if j < 0:
                break
            last, i = text[i + 1 : j], j + 1
            continue
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                break
        elif c in "]}":
            depth -= 1
        elif c == ":" and depth == 1:
            key = (last,)
        i += 1
    return key


def _string_end(text: str, i: int) -> int:
    """The index of the quote that closes the string opened at ``text[i]`` (-1: none). Linear: each
    backslash run is counted once, by the quote after it."""
    j = text.find('"', i + 1)
    while j > 0:
        k = j
        while text[k - 1] == "\\":
            k -= 1
        if (j - k) % 2 == 0:  # an even run of backslashes: the quote is not escaped
            return j
        j = text.find('"', j + 1)
    return j


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reject(path: tuple[str, ...], what: str) -> None:
    param = echo(".".join(path)) or None
    raise APIError(400, f"{param or 'request body'}: {what}", param, "invalid_value")


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The whole body, or 413 past ``limit`` bytes / 408 past ``timeout_s`` (both close the
    connection: the rest of the body is never read)."""
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > limit:
        raise APIError(413, f"request body of {echo(n)} bytes exceeds the limit of {limit}", close=True)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"request body exceeds the limit of {limit} bytes", close=True)
                chunks.append(chunk)
    except TimeoutError:
        msg = f"request body not received within {timeout_s:g} s"
        raise APIError(408, msg, None, "body_timeout", close=True) from None
    except ClientDisconnect:
        raise APIError(400, "client disconnected while sending the body", close=True) from None
    request.state.body_read = True
    return b"".join(chunks)


def parse_request(raw: bytes, cls: type[M]) -> M:
    try:
        return cls.model_validate(parse_json(raw))
    except ValidationError as e:
        raise validation_error(e) from None


async def read_request(request: Request, cls: type[M]) -> M:
    """Key, media type, body, JSON and model: the validated request of an API route."""
    st = server_state(request)
    cfg = st.config
    request.state.owner = check_key(request, cfg.api_key)
    check_json(request)
    raw = await read_body(request, cfg.max_body_bytes, cfg.body_timeout_s)
    req = await asyncio.to_thread(parse_request, raw, cls)
    if req.model != cfg.model_name:
        raise model_not_found(req.model, cfg.model_name)
    if req.n != 1:
        raise APIError(400, f"n: only n=1 is supported, got {req.n}", "n", "invalid_value")
    return req
