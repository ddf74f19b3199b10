"""``GET /`` (the web chat page) and ``GET /health``.

The page is a template filled per request: the model name html-escaped into the HTML and
json-encoded (with ``<``, ``>``, ``&`` escaped) into the script, so no name can end the ``<script>``
element; a Content-Security-Policy lets only the page's own script (a fresh nonce) run."""

from __future__ import annotations

import html
import json
import secrets
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from longmoe.serve.api.state import server_state

PAGE = Path(__file__).resolve().parent / "static" / "index.html"


def script_literal(value: str) -> str:
    """``value`` as a JavaScript string literal that is safe inside an HTML ``<script>`` element."""
    s = json.dumps(value, ensure_ascii=True)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_page(template: str, model_name: str, nonce: str) -> str:
    return (
        template.replace("{{MODEL_HTML}}", html.escape(model_name, quote=True))
        .replace("{{MODEL_JSON}}", script_literal(model_name))
        .replace("{{NONCE}}", nonce)
    )


async def index(request: Request) -> Response:
    st = server_state(request)
    nonce = secrets.token_urlsafe(16)
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}
    return HTMLResponse(render_page(st.page, st.config.model_name, nonce), headers=headers)


async def health(request: Request) -> Response:
    st = server_state(request)
    s = st.engine.stats()
    body = {"status": "ok", "model": st.config.model_name, "running": s["running"], "waiting": s["waiting"]}
    return JSONResponse(body)
