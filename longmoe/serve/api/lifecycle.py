"""Readiness and graceful drain: ``GET /ready`` and the gate that turns new work away while draining.

``/health`` says the process is alive; ``/ready`` says it should get traffic: 503 while a ``--compile``
background warm-up has not produced its first graph (requests would run eagerly and slowly) and from
the moment a drain starts (SIGTERM in ``longmoe serve``). While draining, ``DrainGate`` answers every
new generation or tokenizer request with 503 and ``Retry-After`` (a load balancer or client retries it
on another replica), while requests already admitted run to their end; the CLI then exits 0
(serve/cli/serve.py). While the model loads, ``longmoe serve`` already listens with ``Booting``:
``/health`` 200, ``/ready`` 503 (reason ``loading``), every other route 503 with ``Retry-After``.
"""

from __future__ import annotations

import threading
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from longmoe.serve.api.errors import APIError, error_response
from longmoe.serve.api.state import server_state
from longmoe.serve.engine import Engine

RETRY_AFTER_S = 1  # what a drained replica tells a client: retry now, elsewhere
LOADING_RETRY_AFTER_S = 5  # what a loading replica tells a client: the model takes a while
_GATED_PREFIXES = ("/v1/", "/tokenize", "/detokenize")


class Lifecycle:
    """Whether the server takes new work, and how many generations it has submitted that have not
    ended (counted by the API, not read from the scheduler, whose lists a request moves between
    mid-step); ``drain()`` is safe from a signal handler."""

    def __init__(self) -> None:
        self._draining = threading.Event()
        self.drain_started: float | None = None
        self._lock = threading.Lock()
        self.in_flight = 0

    def started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def ended(self) -> None:
        with self._lock:
            self.in_flight -= 1

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def drain(self) -> None:
        if not self._draining.is_set():
            self.drain_started = time.monotonic()
            self._draining.set()

    def not_ready(self, engine: Engine) -> str | None:
        """Why the server should get no traffic now (None: ready)."""
        if self.draining:
            return "draining"
        c = engine.compiled
        if c is not None and engine.cfg.compile_warmup and c.report()["compiled_graphs"] == 0:
            return "compiling"
        return None


def wait_drained(lifecycle: Lifecycle, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Block until no generation the API submitted is still running (True) or ``timeout_s`` passes
    (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if lifecycle.in_flight == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


async def ready(request: Request) -> Response:
    st = server_state(request)
    why = st.lifecycle.not_ready(st.engine)
    body = {"ready": why is None, "model": st.config.model_name, **({"reason": why} if why else {})}
    return JSONResponse(body, status_code=200 if why is None else 503)


class DrainGate:
    """ASGI middleware: while draining, 503 + ``Retry-After`` for new work (POST and GET under
    ``/v1/``, the tokenizer routes); ``/health``, ``/ready`` and ``/metrics`` still answer."""

    def __init__(self, app: ASGIApp, lifecycle: Lifecycle) -> None:
        self.app, self.lifecycle = app, lifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.lifecycle.draining and scope["path"].startswith(_GATED_PREFIXES):
            err = APIError(503, "the server is draining; retry on another replica", None, "server_draining")
            resp = error_response(err, close=True)
            resp.headers["Retry-After"] = str(RETRY_AFTER_S)
            return await resp(scope, receive, send)
        await self.app(scope, receive, send)


class Booting:
    """The ASGI app the port serves while the model loads, then (``start(app)``) the real one:
    a load balancer's health check sees the process alive (``/health`` 200) but not ready
    (``/ready`` 503), and a client that arrives early gets a retryable 503, not a refused connection.
    """

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.app: ASGIApp | None = None

    def start(self, app: ASGIApp) -> None:
        self.app = app  # one reference swap: each request reads it once, at its start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        if app is not None:
            return await app(scope, receive, send)
        if scope["type"] != "http":  # websockets: none are served
            return None
        path = scope["path"]
        if path == "/health":
            resp: Response = JSONResponse({"status": "loading", "model": self.model_name})
        elif path == "/ready":
            body = {"ready": False, "model": self.model_name, "reason": "loading"}
            resp = JSONResponse(body, status_code=503)
        else:
            err = APIError(503, "the model is loading; retry shortly", None, "model_loading")
            resp = error_response(err, close=True)
            resp.headers["Retry-After"] = str(LOADING_RETRY_AFTER_S)
        return await resp(scope, receive, send)
