"""``longmoe serve --model DIR --port 8000``: the OpenAI-compatible HTTP server (see serve/api/).

Safety options (docs/serve.md, "Running it safely"): ``--api-key``, ``--allowed-hosts``,
``--cors-origins``, ``--metrics-public``, ``--max-body-kb``, ``--body-timeout``,
``--max-connections``, ``--max-requests-per-client``. Operations (docs/deploy.md): ``--access-log``,
``--otlp-endpoint``, ``--drain-timeout``; SIGTERM drains (``/ready`` 503, new requests 503 with
``Retry-After``, running ones finish) and exits 0; a second SIGTERM or SIGINT stops at once. The port
opens before the model loads: ``/health`` 200, ``/ready`` and the API 503 until the engine is built
(``api.lifecycle.Booting``).
Documents (docs/serve.md, "Documents"): ``--files-dir`` / ``--files-s3``, ``--api-keys``,
``--max-file-mb``, ``--max-files-per-key``, ``--max-storage-mb-per-key``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time

import uvicorn

from longmoe.cli.argtypes import port
from longmoe.serve.api import create_app, uvicorn_config
from longmoe.serve.api.app import DEFAULT_MAX_CONNECTIONS
from longmoe.serve.api.lifecycle import Booting, Lifecycle, wait_drained
from longmoe.serve.api.security import KeyRing
from longmoe.serve.api.state import DEFAULT_BODY_TIMEOUT_S, LOCAL_HOSTS
from longmoe.serve.cli.options import add_engine_arguments, engine_from_args
from longmoe.serve.compiled import announce
from longmoe.serve.engine import Engine
from longmoe.serve.files.service import FileQuota
from longmoe.serve.files.store import open_store

API_KEY_ENV = "LONGMOE_API_KEY"
_ANY_ADDRESS = ("0.0.0.0", "::", "")
DEFAULT_DRAIN_TIMEOUT_S = 30.0
OTLP_ENV = "LONGMOE_OTLP_ENDPOINT"


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
    parser.add_argument(
        "--api-keys", default=None, metavar="FILE",
        help="several API keys, one a line ('NAME:KEY' or 'KEY'): files, quotas and prefix-cache state "
        "are kept per key (instead of --api-key)",
    )  # fmt: skip
    parser.add_argument(
        "--files-dir", default=None, metavar="DIR",
        help="turn on the Files API (/v1/files, file content parts) storing files in DIR (default: off)",
    )  # fmt: skip
    parser.add_argument(
        "--files-s3", default=None, metavar="URL",
        help="store files in S3 instead: s3://bucket/prefix[?endpoint_url=http://host:port] "
        "(boto3's credentials)",
    )  # fmt: skip
    q = FileQuota()
    parser.add_argument("--max-file-mb", type=int, default=q.max_file_bytes >> 20,
                        help=f"largest upload in MiB ({q.max_file_bytes >> 20})")  # fmt: skip
    parser.add_argument("--max-files-per-key", type=int, default=q.max_files,
                        help=f"files one key may store ({q.max_files})")  # fmt: skip
    parser.add_argument("--max-storage-mb-per-key", type=int, default=q.max_bytes >> 20,
                        help=f"MiB one key may store ({q.max_bytes >> 20})")  # fmt: skip
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
    parser.add_argument(
        "--access-log", choices=("json", "off"), default="json",
        help="one JSON line per request on stderr (request id, key hash, route, status, tokens, TTFT, "
        "duration, finish reason, cached tokens) or none (default json)",
    )  # fmt: skip
    parser.add_argument(
        "--otlp-endpoint", default=None,
        help=f"export OpenTelemetry traces (queue/prefill/decode spans) over OTLP/HTTP to this URL, e.g. "
        f"http://127.0.0.1:4318/v1/traces (default: ${OTLP_ENV} if set, else off)",
    )  # fmt: skip
    parser.add_argument(
        "--drain-timeout", type=float, default=DEFAULT_DRAIN_TIMEOUT_S,
        help=f"seconds running requests get to finish after SIGTERM before they are cut "
        f"({DEFAULT_DRAIN_TIMEOUT_S:g})",
    )  # fmt: skip


def allowed_hosts(bind: str, given: list[str] | None) -> tuple[str, ...]:
    """``given``, else localhost names plus the bound address (bracketed if IPv6)."""
    if given is not None:
        return tuple(given)
    if bind in _ANY_ADDRESS or bind in LOCAL_HOSTS:
        return LOCAL_HOSTS
    return (*LOCAL_HOSTS, f"[{bind}]" if ":" in bind else bind)


def _access_logger() -> None:
    """The ``longmoe.access`` logger's JSON lines to stderr, as they are (no prefix)."""
    log = logging.getLogger("longmoe.access")
    if not any(getattr(h, "_longmoe", False) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        h._longmoe = True  # type: ignore[attr-defined]
        log.addHandler(h)
    log.setLevel(logging.INFO)
    log.propagate = False


def _tracer(endpoint: str | None, name: str):
    if not endpoint:
        return None
    from longmoe.serve.api.tracing import Tracer

    return Tracer.otlp(endpoint, service=f"longmoe:{name}")


def run(args: argparse.Namespace) -> int:
    if not args.drain_timeout >= 0 or args.drain_timeout == float("inf"):
        print(
            f"longmoe serve: error: --drain-timeout: expected seconds >= 0, got {args.drain_timeout}",
            file=sys.stderr,
        )
        return 2
    name = args.model_name or os.path.basename(os.path.abspath(args.model))
    try:
        tracer = _tracer(args.otlp_endpoint or os.environ.get(OTLP_ENV), name)
    except RuntimeError as e:
        print(f"longmoe serve: error: {e}", file=sys.stderr)
        return 2
    key: str | KeyRing | None = (
        args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    )
    try:
        if args.api_keys:
            key = KeyRing.load(args.api_keys)
        quota = FileQuota(args.max_files_per_key, args.max_storage_mb_per_key << 20, args.max_file_mb << 20)
        store = open_store(args.files_dir, args.files_s3) if (args.files_dir or args.files_s3) else None
    except (OSError, ValueError, ImportError) as e:
        print(f"longmoe serve: error: {e}", file=sys.stderr)
        return 2
    hosts = allowed_hosts(args.host, args.allowed_hosts)
    # the port opens before the model loads: /health 200, /ready and the API 503 until it is built
    booting = Booting(name)
    server = uvicorn.Server(
        uvicorn_config(booting, args.host, args.port, args.max_connections, args.log_level)
    )
    engines: list[Engine] = []

    def http() -> None:
        try:
            server.run()
        finally:
            for e in engines:
                e.stop()  # wakes run_forever (the port taken, or a shutdown)

    th = threading.Thread(target=http, name="longmoe-http", daemon=True)
    th.start()
    while not server.started and th.is_alive():  # a taken port fails here, before the model loads
        time.sleep(0.01)
    if not th.is_alive():
        return 1
    print(f"listening on http://{args.host}:{args.port}; loading the model ({args.model})", flush=True)
    previous = signal.signal(signal.SIGTERM, _quit_while_loading)
    try:
        engine = engine_from_args(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"longmoe serve: error: {e}", file=sys.stderr)
        return _stop_http(server, th, 2)
    except SystemExit:
        return _stop_http(server, th, 0)
    except KeyboardInterrupt:
        return _stop_http(server, th, 130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    engines.append(engine)
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
        access_log=args.access_log == "json",
        tracer=tracer,
        files=store,
        file_quota=quota,
    )
    if args.access_log == "json":
        _access_logger()
    print(f"serving model '{name}' on http://{args.host}:{args.port} (api key {'on' if key else 'off'}; "
          f"files {'on' if store else 'off'}; "
          f"hosts {', '.join(hosts)})")  # fmt: skip
    if engine.compiled is not None:
        print(announce(engine.compiled, args.compile_warmup), file=sys.stderr)
    if args.host in _ANY_ADDRESS and args.allowed_hosts is None:
        print(
            "note: bound to every interface; add this machine's names with --allowed-hosts", file=sys.stderr
        )
    booting.start(app)
    try:
        with engine:
            if not th.is_alive():  # the server stopped while the model loaded
                return 1
            return serve_on_main_thread(engine, server, app.state.server.lifecycle, args.drain_timeout, th)
    finally:
        if tracer is not None:
            tracer.shutdown()


def _quit_while_loading(signum: int, frame: object) -> None:
    raise SystemExit(0)  # nothing is in flight yet: a SIGTERM while loading is a clean stop


def _stop_http(server: uvicorn.Server, th: threading.Thread, code: int) -> int:
    server.should_exit = True
    th.join(timeout=30)
    return code


def serve_on_main_thread(
    engine: Engine,
    server: uvicorn.Server,
    lifecycle: Lifecycle | None = None,
    drain_timeout: float = 0.0,
    th: threading.Thread | None = None,
) -> int:
    """The engine's steps on this (main) thread, where the model was loaded, and uvicorn on another:
    with OpenMP, a second thread running the model pays ~30 µs more per parallel region (engine.py,
    docs/serve.md). The first SIGTERM drains (with a ``lifecycle``): ``/ready`` and new requests 503,
    running requests get ``drain_timeout`` seconds to finish, then both stop. SIGINT, or a second
    SIGTERM, stops at once; if the server cannot start or stops, so does the engine. ``th``: the
    thread already running ``server`` (whose exit must stop the engine), else one is started here."""

    def http() -> None:
        try:
            server.run()
        finally:
            engine.stop()  # wakes run_forever (the port taken, or a shutdown)

    def now() -> None:
        server.should_exit = True
        engine.stop()

    def drain() -> None:
        t0 = time.monotonic()
        n = lifecycle.in_flight
        done = wait_drained(lifecycle, drain_timeout)
        info = {
            "event": "drained" if done else "drain_timeout",
            "seconds": round(time.monotonic() - t0, 3),
            "in_flight_at_sigterm": n,
        }
        print(json.dumps(info), file=sys.stderr, flush=True)
        if not done:  # cut what still runs: each stream gets a retryable 503 error event
            engine.stop()
        server.should_exit = True  # uvicorn lets the responses in flight send their last bytes

    def stop(signum: int, frame: object) -> None:
        if signum != signal.SIGTERM or lifecycle is None or lifecycle.draining:
            return now()
        lifecycle.drain()
        threading.Thread(target=drain, name="longmoe-drain", daemon=True).start()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    if th is None:
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
