"""``GET /`` (the web chat page), ``GET /health`` and ``GET /v1/info`` (what the page shows about the
model and the engine's memory; behind the API key when one is set).

The page is a template filled per request: the model name html-escaped into the HTML and
json-encoded (with ``<``, ``>``, ``&`` escaped) into the script, so no name can end the ``<script>``
element; a Content-Security-Policy lets only the page's own script (a fresh nonce) run; images only from
``data:`` URIs (the thumbnails of attached images, which the page reads as data URIs to send)."""

from __future__ import annotations

import html
import json
import secrets
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from longmoe.serve.api.security import check_key
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
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; img-src data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}
    return HTMLResponse(render_page(st.page, st.config.model_name, nonce), headers=headers)


async def health(request: Request) -> Response:
    st = server_state(request)
    s = st.engine.stats()
    body = {"status": "ok", "model": st.config.model_name, "running": s["running"], "waiting": s["waiting"]}
    return JSONResponse(body)


async def info(request: Request) -> Response:
    """The model's shape and the engine's load and cache memory (the page's status line)."""
    st = server_state(request)
    check_key(request, st.config.api_key)
    e = st.engine
    mc = e.model.cfg
    s = e.stats()
    keys = ("running", "waiting", "tokens_per_second", "cache_bytes_in_use", "cache_bytes_reserved")
    body = {
        "model": st.config.model_name,
        "max_context": e.max_context,
        "parameters": st.model_parameters,
        "layers": mc.n_layers,
        "layer_pattern": mc.layer_pattern,
        "d_model": mc.d_model,
        "vocab_size": mc.vocab_size,
        "device": str(e.device),
        "max_batch": e.cfg.max_batch,
        "cache_budget_bytes": s["cache_budget_bytes"],
        # what the page's image button needs: null for a text-only model
        "vision": None
        if mc.vision is None
        else {
            "patch_size": mc.vision.patch_size,
            "max_image_side": mc.vision.max_image_side,
            "max_images": e.cfg.max_images,
            "max_image_bytes": e.cfg.max_image_bytes,
        },
        # what the page's file button needs: the Files API's per-upload limit, null when it is off
        "files": None if st.files is None else {"max_file_bytes": st.files.quota.max_file_bytes},
        **{k: s[k] for k in keys},
    }
    return JSONResponse(body)
