"""An app behind a real HTTP server in a thread, on a free port: ``serving(app)`` for any app,
``served(model_dir)`` for a saved model behind longmoe's API."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from fastapi import FastAPI

from longmoe.serve.api import create_app, serve_in_thread
from longmoe.serve.engine import Engine

HOST = "127.0.0.1"
JOIN_TIMEOUT_S = 10


@contextlib.contextmanager
def serving(app: FastAPI, **server_opts) -> Iterator[str]:
    """``app`` served by uvicorn in a thread while the block runs; yields its base URL
    (``http://127.0.0.1:PORT``). ``server_opts`` go to ``serve_in_thread`` (e.g. ``max_connections``)."""
    srv, th, port = serve_in_thread(app, **server_opts)
    try:
        yield f"http://{HOST}:{port}"
    finally:
        srv.should_exit = True
        th.join(timeout=JOIN_TIMEOUT_S)


def port_of(url: str) -> int:
    """The port of a base URL from ``serving``."""
    return int(url.rsplit(":", 1)[1])


@contextlib.contextmanager
def served(model_dir: Path, **engine_opts) -> Iterator[tuple[Engine, FastAPI, str]]:
    """The model in ``model_dir`` behind a real HTTP server on a free port: ``(engine, app, base_url)``."""
    engine = Engine.from_dir(model_dir, **engine_opts)
    app = create_app(engine, model_name="tiny")
    try:
        with serving(app) as url:
            yield engine, app, url
    finally:
        engine.close()


def wait_idle(engine: Engine, timeout: float = 10.0) -> dict:
    """The engine's stats once no request is running or waiting (a response can reach the client a
    moment before the engine loop retires its request), or as they stand at ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.stats()
        if s["running"] == 0 and s["waiting"] == 0:
            return s
        time.sleep(0.01)
    return engine.stats()
