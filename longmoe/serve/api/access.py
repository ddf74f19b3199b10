"""One JSON line per HTTP request (the ``longmoe.access`` logger) and the request id.

``AccessLog`` is the outermost middleware: it gives each request a ``RequestRecord`` (in
``request.state.record``), takes the client's ``X-Request-Id`` when it is a plain token (else makes
one) and echoes it on the response, and when the response has been sent (the last byte of a stream
included) or has failed, logs::

    {"ts": ..., "request_id": ..., "key_id": ..., "method": "POST", "route": "/v1/chat/completions",
     "status": 200, "prompt_tokens": 12, "completion_tokens": 8, "cached_tokens": 0, "ttft_s": 0.05,
     "duration_s": 0.31, "finish_reason": "stop", "error": null, "disconnected": false}

``key_id`` is the first 12 hex digits of the SHA-256 of the bearer token the client sent (null
without one): enough to tell keys apart in the logs, never the key. The generation routes fill the
token counts and times through ``RequestRecord.timer``/``completion`` (serve/api/generation.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from longmoe.serve.api.middleware import route_label
from longmoe.serve.request import Completion

log = logging.getLogger("longmoe.access")

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")  # what a client may set; anything else is replaced
KEY_ID_HEX = 12


def key_id(authorization: str) -> str | None:
    """The log's name for the bearer token in an ``Authorization`` header (None without one)."""
    if not authorization.lower().startswith("bearer "):
        return None
    return hashlib.sha256(authorization[7:].encode("utf-8", "replace")).hexdigest()[:KEY_ID_HEX]


def request_id(given: str | None) -> str:
    """The client's id when it is a plain token of at most 128 characters, else a fresh one."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


@dataclass
class RequestRecord:
    id: str
    method: str
    route: str
    key_id: str | None
    start: float  # time.monotonic() when the request arrived
    status: int = 0
    first_token: float | None = None  # set by the generation routes (monotonic)
    completion: Completion | None = None
    error: str | None = None  # the error code of an admitted request that failed

    def line(self, finished: bool) -> str:
        c = self.completion
        ttft = None if self.first_token is None else round(self.first_token - self.start, 6)
        return json.dumps(
            {
                "ts": round(time.time(), 3),
                "request_id": self.id,
                "key_id": self.key_id,
                "method": self.method,
                "route": self.route,
                "status": self.status,
                "prompt_tokens": c.prompt_tokens if c else None,
                "completion_tokens": c.completion_tokens if c else None,
                "cached_tokens": c.cached_tokens if c else None,
                "ttft_s": ttft,
                "duration_s": round(time.monotonic() - self.start, 6),
                "finish_reason": c.finish_reason if c else None,
                "error": self.error,
                "disconnected": not finished,
            },
            ensure_ascii=True,
        )


class AccessLog:
    """ASGI middleware: the request record and id, the ``X-Request-Id`` echo, the JSON line."""

    def __init__(self, app: ASGIApp, enabled: bool = True) -> None:
        self.app, self.enabled = app, enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope["headers"]}
        given = headers.get(REQUEST_ID_HEADER.encode())
        rec = RequestRecord(
            id=request_id(given.decode("latin-1") if given is not None else None),
            method=scope["method"],
            route=route_label(scope["path"]),
            key_id=key_id(headers.get(b"authorization", b"").decode("latin-1")),
            start=time.monotonic(),
        )
        scope.setdefault("state", {})["record"] = rec
        finished = False

        async def send_logged(message: Message) -> None:
            nonlocal finished
            if message["type"] == "http.response.start":
                rec.status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rec.id.encode())]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive, send_logged)
        except BaseException:
            rec.status = rec.status or 500
            raise
        finally:
            if self.enabled:
                log.info(rec.line(finished))
