"""``longmoe serve --model DIR --port 8000``: the OpenAI-compatible HTTP server (see server.py)."""

from __future__ import annotations

import argparse
import os
import sys

from longmoe.serve.cli_generate import add_engine_arguments, engine_from_args

API_KEY_ENV = "LONGMOE_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_engine_arguments(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on /v1 routes (default: ${API_KEY_ENV} if set)",
    )
    parser.add_argument("--model-name", default=None, help="model id clients send (default: directory name)")
    parser.add_argument("--max-body-kb", type=int, default=1024, help="request body size limit in KiB (1024)")
    parser.add_argument("--log-level", default="info", help="uvicorn log level (default info)")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from longmoe.serve.server import create_app

    try:
        engine = engine_from_args(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    name = args.model_name or os.path.basename(os.path.abspath(args.model))
    app = create_app(engine, model_name=name, api_key=key, max_body_bytes=args.max_body_kb * 1024)
    print(f"serving model '{name}' on http://{args.host}:{args.port} (api key {'on' if key else 'off'})")
    with engine:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
