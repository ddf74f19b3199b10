"""Who may talk to the server: the API key, the JSON-only body rule (cross-site form posts), Host
header parsing (the check itself is ``middleware.HostGuard``) and the per-client cap on requests
in flight (fairness)."""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
from collections import Counter
from pathlib import Path

from starlette.requests import Request

from longmoe.serve.api.errors import APIError, echo

ANONYMOUS = "anonymous"  # the owner of files on a server without keys
SINGLE = "default"  # the owner of files on a server with one --api-key
_OWNER = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class KeyRing(dict[str, str]):
    """Several API keys (``--api-keys FILE``), each mapped to its owner name: files, quotas and
    prefix-cache state are kept per owner. The file has one key a line, ``NAME:KEY`` or ``KEY``
    (then the owner is ``key-`` + 12 hex of the key's SHA-256); ``#`` lines and blank lines are skipped."""

    @classmethod
    def load(cls, path: str | Path) -> KeyRing:
        ring = cls()
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, key = line.rpartition(":") if ":" in line else ("", "", line)
            name = name.strip() or "key-" + hashlib.sha256(key.encode()).hexdigest()[:12]
            key = key.strip()
            if len(key) < 8 or not key.isprintable() or " " in key:
                raise ValueError(f"{path}:{n}: a key must be at least 8 printable characters, no spaces")
            if not _OWNER.match(name):
                raise ValueError(f"{path}:{n}: owner name must be 1-64 of [A-Za-z0-9_-]")
            if key in ring or name in ring.values():
                raise ValueError(f"{path}:{n}: duplicate key or owner name")
            ring[key] = name
        if not ring:
            raise ValueError(f"{path}: no keys")
        return ring


def check_key(request: Request, api_key: str | KeyRing | None) -> str:
    """401 unless ``Authorization: Bearer <key>`` names the key (or one of the ``KeyRing``); returns
    its owner (``anonymous`` without a key)."""
    if api_key is None:
        return ANONYMOUS
    auth = request.headers.get("authorization", "")
    given = auth[7:] if auth.lower().startswith("bearer ") else ""
    if isinstance(api_key, KeyRing):
        owner = None
        for key, name in api_key.items():  # compare with every key: the time says nothing
            if hmac.compare_digest(given.encode(), key.encode()):
                owner = name
        if owner is not None:
            return owner
    elif hmac.compare_digest(given.encode(), api_key.encode()):
        return SINGLE
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
