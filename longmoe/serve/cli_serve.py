"""``longmoe serve --model DIR --port 8000``: the OpenAI-compatible HTTP server (see serve/api/).

Safety options (docs/serve.md, "Running it safely"): ``--api-key``, ``--allowed-hosts``,
``--cors-origins``, ``--metrics-public``, ``--max-body-kb``, ``--body-timeout``,
``--max-connections``, ``--max-requests-per-client``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

import uvicorn

from longmoe.argtypes import port
from longmoe.serve.api import create_app, uvicorn_config
from longmoe.serve.api.app import DEFAULT_MAX_CONNECTIONS
from longmoe.serve.api.state import DEFAULT_BODY_TIMEOUT_S, LOCAL_HOSTS
from longmoe.serve.cli_generate import add_engine_arguments, engine_from_args
from longmoe.serve.compiled import announce
from longmoe.serve.engine import Engine

API_KEY_ENV = "LONGMOE_API_KEY"
_ANY_ADDRESS = ("0.0.0.0", "::", "")


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port, default=8000, help="TCP port, 0-65535 (default 8000)")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1 and /metrics (default: ${API_KEY_ENV} if set)",
    )
    parser.add_argument("--model-name", default=None, help="model id clients send (default: directory name)")
    parser.add_argument("--max-body-kb", type=int, default=1024, help="request body size limit in KiB (1024)")
    parser.add_argument(
        "--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT_S,
        help=f"seconds a request body may take to arrive ({DEFAULT_BODY_TIMEOUT_S:g})",
    )  # fmt: skip
    parser.add_argument(
        "--allowed-hosts", type=_csv, default=None,
        help="comma-separated Host header names accepted, '*' for any "
        f"(default: {', '.join(LOCAL_HOSTS)} and the --host address)",
    )  # fmt: skip
    parser.add_argument(
        "--cors-origins", type=_csv, default=[],
        help="comma-separated origins allowed to call the API from a browser (default: none)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-public",
        action="store_true",
        help="serve /metrics without the API key (default: key needed)",
    )
    parser.add_argument(
        "--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
        help=f"concurrent connections before 503 ({DEFAULT_MAX_CONNECTIONS})",
    )  # fmt: skip
    parser.add_argument(
        "--max-requests-per-client", type=int, default=None,
        help="generations in flight per client address before 429 (default: half of --max-batch; 0: off)",
    )  # fmt: skip
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default info)")


def allowed_hosts(bind: str, given: list[str] | None) -> tuple[str, ...]:
    """``given``, else localhost names plus the bound address (bracketed if IPv6)."""
    if given is not None:
        return tuple(given)
    if bind in _ANY_ADDRESS or bind in LOCAL_HOSTS:
        return LOCAL_HOSTS
    return (*LOCAL_HOSTS, f"[{bind}]" if ":" in bind else bind)


def run(args: argparse.Namespace) -> int:
    try:
        engine = engine_from_args(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"longmoe serve: error: {e}", file=sys.stderr)
        return 2
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    name = args.model_name or os.path.basename(os.path.abspath(args.model))
    hosts = allowed_hosts(args.host, args.allowed_hosts)
    app = create_app(
        engine,
        model_name=name,
        api_key=key,
        max_body_bytes=args.max_body_kb * 1024,
        allowed_hosts=hosts,
        cors_origins=args.cors_origins,
        metrics_public=args.metrics_public,
        body_timeout_s=args.body_timeout,
        max_requests_per_client=args.max_requests_per_client,
    )
    print(f"serving model '{name}' on http://{args.host}:{args.port} (api key {'on' if key else 'off'}; "
          f"hosts {', '.join(hosts)})")  # fmt: skip
    if engine.compiled is not None:
        print(announce(engine.compiled, args.compile_warmup), file=sys.stderr)
    if args.host in _ANY_ADDRESS and args.allowed_hosts is None:
        print(
            "note: bound to every interface; add this machine's names with --allowed-hosts", file=sys.stderr
        )
    server = uvicorn.Server(uvicorn_config(app, args.host, args.port, args.max_connections, args.log_level))
    with engine:
        return serve_on_main_thread(engine, server)


def serve_on_main_thread(engine: Engine, server: uvicorn.Server) -> int:
    """The engine's steps on this (main) thread, where the model was loaded, and uvicorn on another:
    with OpenMP, a second thread running the model pays ~30 µs more per parallel region (engine.py,
    docs/serve.md). SIGINT / SIGTERM stop both; if the server cannot start or stops, so does the engine."""

    def http() -> None:
        try:
            server.run()
        finally:
            engine.stop()  # wakes run_forever (the port taken, or a shutdown)

    def stop(signum: int, frame: object) -> None:
        server.should_exit = True
        engine.stop()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    th = threading.Thread(target=http, name="longmoe-http", daemon=True)
    th.start()
    try:
        engine.run_forever()
    finally:
        server.should_exit = True
        th.join(timeout=30)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started else 1
