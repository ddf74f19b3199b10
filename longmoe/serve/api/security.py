"""Who may talk to the server: the API key, the JSON-only body rule (cross-site form posts), Host
header parsing (the check itself is ``middleware.HostGuard``) and the per-client cap on requests
in flight (fairness)."""

from __future__ import annotations

import hmac
import threading
from collections import Counter

from starlette.requests import Request

from longmoe.serve.api.errors import APIError, echo


def check_key(request: Request, api_key: str | None) -> None:
    """401 unless ``Authorization: Bearer <api_key>`` (no-op without a key)."""
    if api_key is None:
        return
    auth = request.headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        msg = "missing or invalid API key (send 'Authorization: Bearer KEY')"
        raise APIError(401, msg, None, "invalid_api_key")


def check_json(request: Request) -> None:
    """415 unless the body is declared ``application/json``: a page on another site can send a
    ``text/plain`` POST without the browser asking the server first, but never a JSON one."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        msg = f"Content-Type must be application/json, got '{echo(ctype)}'"
        raise APIError(415, msg, None, "unsupported_media_type", close=True)


def host_name(host: str) -> str:
    """The Host header without its port: ``"[::1]:8000" -> "[::1]"``, ``"a.b:80" -> "a.b"``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class ClientLimiter:
    """At most ``limit`` generations in flight per client address (0 = no limit), so one client
    cannot take every batch row and queue slot. Released from the engine thread: locked."""

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit
        self._inflight: Counter[str] = Counter()
        self._lock = threading.Lock()

    def acquire(self, client: str) -> None:
        with self._lock:
            if self.limit and self._inflight[client] >= self.limit:
                msg = f"too many requests in flight from this client (limit {self.limit}); retry later"
                raise APIError(429, msg, None, "rate_limit_exceeded")
            self._inflight[client] += 1

    def release(self, client: str) -> None:
        with self._lock:
            self._inflight[client] -= 1
            if self._inflight[client] <= 0:
                del self._inflight[client]

    def in_flight(self, client: str) -> int:
        with self._lock:
            return self._inflight[client]
