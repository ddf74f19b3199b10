"""``GET /tokenizer_info``, ``POST /tokenize``, ``POST /detokenize``: the model's tokenizer over HTTP.

vLLM's routes and fields, which lm-evaluation-harness's ``local-completions`` backend detects and uses
(``tokenizer_backend=remote``): it then tokenises with the served model's own tokenizer and sends token
ids, so log-likelihoods are computed on exactly the tokens the model sees. Guarded by the API key like
the ``/v1`` routes.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from longmoe.serve.api.errors import APIError
from longmoe.serve.api.intake import parse_request, read_body
from longmoe.serve.api.protocol import DetokenizeRequest, TokenizeRequest
from longmoe.serve.api.security import check_json, check_key
from longmoe.serve.api.state import server_state

M = TypeVar("M", bound=BaseModel)


async def _read(request: Request, cls: type[M]) -> M:
    """Key, media type, body and JSON (no ``model`` field required: lm-eval's tokenizer omits it)."""
    st = server_state(request)
    check_key(request, st.config.api_key)
    check_json(request)
    raw = await read_body(request, st.config.max_body_bytes, st.config.body_timeout_s)
    return await asyncio.to_thread(parse_request, raw, cls)


async def tokenizer_info(request: Request) -> Response:
    st = server_state(request)
    check_key(request, st.config.api_key)
    tok = st.engine.tokenizer
    info = {
        "tokenizer_class": "longmoe.data.tokenizer.Tokenizer",
        "bos_token": tok.id_to_token(tok.bos_id),
        "eos_token": tok.id_to_token(tok.eos_id),
        "pad_token": tok.id_to_token(tok.pad_id),
        "vocab_size": tok.vocab_size,
        "max_model_len": st.engine.max_context,
    }
    return JSONResponse(info)


async def tokenize(request: Request) -> Response:
    st = server_state(request)
    req = await _read(request, TokenizeRequest)
    tok = st.engine.tokenizer
    ids = await asyncio.to_thread(tok.encode, req.prompt, req.add_special_tokens)
    return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": st.engine.max_context})


async def detokenize(request: Request) -> Response:
    st = server_state(request)
    req = await _read(request, DetokenizeRequest)
    tok = st.engine.tokenizer
    bad = [t for t in req.tokens if not 0 <= t < tok.vocab_size]
    if bad:
        raise APIError(
            400, f"tokens: ids outside [0, {tok.vocab_size}): {bad[:5]}", "tokens", "invalid_value"
        )
    return JSONResponse({"prompt": tok.decode(req.tokens)})
