"""The server's own ASGI middleware, pure ASGI so ``receive`` reaches handlers untouched (they
watch it for the client's disconnect): counting responses by route and status, and the Host check."""

from __future__ import annotations

import threading
from collections import Counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from longmoe.serve.api.errors import APIError, echo, error_response
from longmoe.serve.api.security import host_name

_BODY_METHODS = ("POST", "PUT", "PATCH")
ROUTE_LABELS = (
    "/", "/health", "/ready", "/metrics", "/v1/info", "/v1/models", "/v1/completions", "/v1/chat/completions",
    "/tokenize", "/detokenize", "/tokenizer_info",
)  # fmt: skip
_MODEL_ROUTE = "/v1/models/{id}"


def route_label(path: str) -> str:
    """A bounded label for a request path (unknown paths share ``other``)."""
    if path in ROUTE_LABELS:
        return path
    return _MODEL_ROUTE if path.startswith("/v1/models/") else "other"


class HTTPMetrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.errors: Counter[str] = Counter()  # requests that failed after admission, by error code
        self.lock = threading.Lock()

    def count(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] += 1

    def count_error(self, code: str) -> None:
        with self.lock:
            self.errors[code] += 1


class CountResponses:
    """ASGI middleware counting responses by route and status into ``HTTPMetrics``."""

    def __init__(self, app: ASGIApp, metrics: HTTPMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = route_label(scope["path"])

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.count(route, message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


class HostGuard:
    """ASGI middleware: 421 for a Host header outside ``allowed`` (``"*"`` allows any). A page that
    rebinds its own DNS name to 127.0.0.1 still sends its own name as Host, so it is refused."""

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app, self.allowed = app, frozenset(host_name(h) for h in allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or "*" in self.allowed:
            return await self.app(scope, receive, send)
        raw = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if host_name(raw) not in self.allowed:
            msg = f"Host '{echo(raw)}' is not allowed (see --allowed-hosts)"
            err = APIError(421, msg, None, "host_not_allowed")
            close = scope["method"] in _BODY_METHODS
            return await error_response(err, close=close)(scope, receive, send)
        await self.app(scope, receive, send)
