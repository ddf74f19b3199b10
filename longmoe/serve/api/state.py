"""What every handler reads from ``app.state.server``: the engine, the server's settings, its
counters and the per-client limiter."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request

from longmoe.serve.api.middleware import HTTPMetrics
from longmoe.serve.api.security import ClientLimiter, KeyRing
from longmoe.serve.engine import Engine
from longmoe.serve.files.service import FileService
from longmoe.serve.reply_ids import ReplyIds
from longmoe.serve.structured import JsonGrammars

DEFAULT_MAX_BODY = 1 << 20  # bytes
DEFAULT_BODY_TIMEOUT_S = 30.0
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass
class ServerConfig:
    """The HTTP side's settings (see docs/serve.md, "Running it safely")."""

    model_name: str = "longmoe"
    api_key: str | KeyRing | None = None  # guards every /v1 route (and /metrics unless metrics_public)
    max_body_bytes: int = DEFAULT_MAX_BODY
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # the whole body must arrive within this
    allowed_hosts: tuple[str, ...] = LOCAL_HOSTS  # Host header values accepted ("*": any)
    cors_origins: tuple[str, ...] = ()  # origins allowed to call from a browser; none by default
    metrics_public: bool = False  # serve /metrics without the key
    max_requests_per_client: int = 0  # in-flight generations per client address; 0 = no limit

    def __post_init__(self) -> None:
        for f in ("max_body_bytes", "body_timeout_s"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
                raise ValueError(f"{f}: expected a number > 0, got {v!r}")
        v = self.max_requests_per_client
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"max_requests_per_client: expected an integer >= 0, got {v!r}")
        self.allowed_hosts = tuple(h.lower() for h in self.allowed_hosts)
        self.cors_origins = tuple(self.cors_origins)


@dataclass
class ServerState:
    engine: Engine
    config: ServerConfig
    metrics: HTTPMetrics = field(default_factory=HTTPMetrics)
    limiter: ClientLimiter = field(default_factory=ClientLimiter)
    created: int = field(default_factory=lambda: int(time.time()))
    page: str = ""  # the web page's template
    model_parameters: int = 0  # the model's parameter count (GET /v1/info)
    files: FileService | None = None  # the Files API (None: off)
    spool: Path | None = None  # where uploads stream to before they are stored
    grammars: JsonGrammars | None = None  # response_format grammars (built on first use)
    prometheus: Any = None  # the app's ServeMetrics (serve/api/metrics.py), set by create_app
    lifecycle: Any = None  # the app's Lifecycle (serve/api/lifecycle.py): readiness and drain
    tracer: Any = None  # an OpenTelemetry Tracer (serve/api/tracing.py) or None: traces off
    replies: ReplyIds = field(default_factory=ReplyIds)  # chat replies' generated ids (serve/reply_ids.py)
    _grammars_lock: threading.Lock = field(default_factory=threading.Lock)

    def json_grammars(self) -> JsonGrammars:
        """The server's grammar compiler and cache, built on first use (a worker thread calls it)."""
        with self._grammars_lock:
            if self.grammars is None:
                self.grammars = JsonGrammars(self.engine.tokenizer, self.engine.vocab_size)
            return self.grammars


def server_state(request: Request) -> ServerState:
    return request.app.state.server
