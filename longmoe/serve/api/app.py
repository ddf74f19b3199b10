"""``create_app``: the route table, the middleware and the error handlers around the handlers of
the other modules, which read everything they need from ``app.state.server`` (a ``ServerState``).

Outermost first, a request passes: ``AccessLog`` (request id, one JSON log line), ``CountResponses``
(metrics), ``DrainGate`` (503 while draining), ``HostGuard`` (421 for a foreign Host header), CORS
(only when origins are configured), then the route. Every error leaves as
OpenAI's error object; one whose request body was not read to its end carries ``Connection: close``.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from longmoe.data.images import decode_image, patchify
from longmoe.serve.api import chat, completions, files, lifecycle, metrics, models, tokenize, web
from longmoe.serve.api.access import AccessLog
from longmoe.serve.api.errors import APIError, echo, error_response
from longmoe.serve.api.middleware import CountResponses, HostGuard
from longmoe.serve.api.security import ClientLimiter, KeyRing
from longmoe.serve.api.state import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_MAX_BODY,
    LOCAL_HOSTS,
    ServerConfig,
    ServerState,
)
from longmoe.serve.engine import Engine
from longmoe.serve.files.documents import Document, DocumentLimits
from longmoe.serve.files.service import FileQuota, FileService
from longmoe.serve.files.store import ObjectStore

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 256  # uvicorn's limit_concurrency: 503 beyond this many connections/tasks
_BODY_METHODS = ("POST", "PUT", "PATCH")

ROUTES = [  # (method, path, handler)
    ("GET", "/", web.index),
    ("GET", "/health", web.health),
    ("GET", "/ready", lifecycle.ready),
    ("GET", "/metrics", metrics.prometheus),
    ("GET", "/v1/info", web.info),
    ("GET", "/v1/models", models.list_models),
    ("GET", "/v1/models/{model_id:path}", models.retrieve_model),
    ("POST", "/v1/completions", completions.create_completion),
    ("POST", "/v1/chat/completions", chat.create_chat_completion),
    ("POST", "/v1/files", files.create_file),
    ("GET", "/v1/files", files.list_files),
    ("GET", "/v1/files/{file_id}", files.retrieve_file),
    ("GET", "/v1/files/{file_id}/content", files.file_content),
    ("DELETE", "/v1/files/{file_id}", files.delete_file),
    ("GET", "/tokenizer_info", tokenize.tokenizer_info),
    ("POST", "/tokenize", tokenize.tokenize),
    ("POST", "/detokenize", tokenize.detokenize),
]


def default_client_limit(engine: Engine) -> int:
    """Half the batch: one client can never hold every row."""
    return max(1, engine.cfg.max_batch // 2)


def create_app(
    engine: Engine,
    model_name: str = "longmoe",
    api_key: str | KeyRing | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    *,
    allowed_hosts: tuple[str, ...] | list[str] = LOCAL_HOSTS,
    cors_origins: tuple[str, ...] | list[str] = (),
    metrics_public: bool = False,
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    max_requests_per_client: int | None = None,
    access_log: bool = True,
    tracer: object | None = None,
    files: ObjectStore | None = None,
    file_quota: FileQuota | None = None,
    document_limits: DocumentLimits | None = None,
) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name``; ``api_key`` guards every ``/v1`` route
    and ``/metrics`` (unless ``metrics_public``). ``max_requests_per_client``: generations in flight
    per client address (None: half of ``max_batch``; 0: no limit). See ``ServerConfig``. ``access_log``:
    one JSON line per request on the ``longmoe.access`` logger; ``tracer``: a ``tracing.Tracer`` or None.
    ``files``: the store behind the Files API (None: off), with ``file_quota`` and ``document_limits``."""
    limit = default_client_limit(engine) if max_requests_per_client is None else max_requests_per_client
    config = ServerConfig(
        model_name=model_name,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        body_timeout_s=body_timeout_s,
        allowed_hosts=tuple(allowed_hosts),
        cors_origins=tuple(cors_origins),
        metrics_public=metrics_public,
        max_requests_per_client=limit,
    )
    app = FastAPI(title="longmoe", docs_url=None, redoc_url=None, openapi_url=None)
    st = ServerState(engine, config, limiter=ClientLimiter(limit), page=web.PAGE.read_text())
    st.model_parameters = sum(p.numel() for p in engine.model.parameters())
    st.prometheus = metrics.ServeMetrics(engine, st.metrics, model_name)
    st.lifecycle = lifecycle.Lifecycle()
    st.tracer = tracer
    if files is not None:
        st.files = file_service(engine, files, file_quota, document_limits)
        st.spool = Path(tempfile.mkdtemp(prefix="longmoe-uploads-"))
    app.state.server = st
    for method, path, handler in ROUTES:
        app.add_api_route(path, handler, methods=[method])
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _crash)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(HostGuard, allowed=config.allowed_hosts)
    app.add_middleware(lifecycle.DrainGate, lifecycle=st.lifecycle)
    app.add_middleware(CountResponses, metrics=st.metrics)
    app.add_middleware(AccessLog, enabled=access_log)
    return app


def file_service(
    engine: Engine, store: ObjectStore, quota: FileQuota | None, limits: DocumentLimits | None
) -> FileService:
    """The Files API over ``store``: documents counted in the engine's tokens (text and page
    images), deletions dropping the engine's prefix snapshots of their questions."""
    vision = engine.model.cfg.vision

    def count_tokens(doc: Document) -> int:
        n = len(engine.tokenizer.encode(doc.block(with_images=vision is not None)))
        if vision is not None:
            n += sum(patchify(decode_image(raw), vision).n + 2 for raw in doc.images.values())
        return n

    return FileService(
        store, count_tokens, quota or FileQuota(), limits or DocumentLimits(), engine.forget_prefix
    )


def _body_unread(request: Request) -> bool:
    return request.method in _BODY_METHODS and not getattr(request.state, "body_read", False)


async def _api_error(request: Request, e: APIError) -> Response:
    return error_response(e, close=_body_unread(request))


async def _http_error(request: Request, e: StarletteHTTPException) -> Response:
    msg = {404: f"no route {echo(request.url.path)}", 405: f"method {echo(request.method)} not allowed"}
    err = APIError(e.status_code, msg.get(e.status_code, echo(str(e.detail))), None, None)
    return error_response(err, close=_body_unread(request))


async def _crash(request: Request, e: Exception) -> Response:
    log.exception("unhandled error on %s", echo(request.url.path))
    return error_response(
        APIError(500, f"internal error: {type(e).__name__}", None, "internal_error"), close=True
    )


def uvicorn_config(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    log_level: str = "warning",
    access_log: bool = False,
) -> uvicorn.Config:
    """How the server runs under uvicorn (the CLI and ``serve_in_thread`` share it): at most
    ``max_connections`` connections or tasks (503 beyond), idle keep-alive connections closed after 5 s."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="off",
        limit_concurrency=max_connections,
        timeout_keep_alive=5,
        access_log=access_log,  # uvicorn's free-text line; the app logs its own JSON one (access.py)
    )


def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, max_connections: int = DEFAULT_MAX_CONNECTIONS
) -> tuple[uvicorn.Server, threading.Thread, int]:
    """Start uvicorn on a background thread (tests, benchmarks); returns ``(server, thread, port)``.

    Stop with ``server.should_exit = True; thread.join()``."""
    server = uvicorn.Server(uvicorn_config(app, host, port, max_connections))
    th = threading.Thread(target=server.run, name="longmoe-http", daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not th.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, th, port
