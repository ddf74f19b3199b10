"""OpenAI-compatible HTTP server: a thin FastAPI shell around the ``Engine``.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming as
server-sent events ending with ``data: [DONE]``), ``GET /health``, Prometheus ``GET /metrics`` and a
web chat page at ``GET /``. The engine runs on its own thread; each HTTP request is a coroutine
that submits to it and receives events through an ``asyncio.Queue`` fed thread-safely.

Every bad input gets a 4xx with an OpenAI-style error object ``{"error": {"message", "type",
"param", "code"}}``: the body is read by hand (size limit, JSON errors) and validated by pydantic
models that forbid unknown fields and use strict types. A client that disconnects cancels its
request, which frees its cache rows at the engine's next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from longmoe.serve.api_models import ChatRequest, CompletionRequest
from longmoe.serve.engine import Engine, EngineError, Event
from longmoe.serve.sampling import SamplingError, SamplingParams

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 1 << 20  # bytes
DEFAULT_CHAT_MAX_TOKENS = 512
_POLL_S = 0.25  # how often a waiting request checks whether its client is still there
STATIC = Path(__file__).resolve().parent / "static"


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}.get(
            status, "invalid_request_error" if status < 500 else "server_error"
        )


def error_body(e: APIError) -> dict:
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}


def _field_path(loc: tuple) -> list:
    """A pydantic error location without the union-member tags (``str``, ``list[int]``, ...)."""
    return [x for x in loc if isinstance(x, int) or not (x in _TYPE_TAGS or "[" in x or "-" in x)]


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "StreamOptions", "ContentPart"}


def _validation_error(e: ValidationError) -> APIError:
    """The first failing field of a pydantic error as one readable sentence."""
    errs = e.errors(include_url=False)
    first = errs[0]
    loc = _field_path(first["loc"])
    param = ".".join(str(x) for x in loc) or None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"unknown field '{param}'", param, "unknown_field")
    if not loc:
        return APIError(400, "request body: expected a JSON object", None, "invalid_type")
    same = [x for x in errs if _field_path(x["loc"]) == loc]
    msgs = list(dict.fromkeys(x["msg"] for x in same))
    msg = msgs[0] if len(msgs) == 1 else "invalid value (" + "; or ".join(msgs[:3]) + ")"
    return APIError(400, f"{param}: {msg}", param, "invalid_value")


class _Metrics:
    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()

    def count(self, route: str, status: int) -> None:
        with self.lock:
            self.requests[(route, status)] += 1

    def render(self, engine: Engine) -> str:
        s = engine.stats()
        lines = [
            "# HELP longmoe_http_requests_total HTTP requests by route and status code.",
            "# TYPE longmoe_http_requests_total counter",
        ]
        with self.lock:
            for (route, status), n in sorted(self.requests.items()):
                lines.append(f'longmoe_http_requests_total{{route="{route}",status="{status}"}} {n}')
        series = [
            ("requests_total", "counter", "requests submitted to the engine", s["requests"]),
            ("prompt_tokens_total", "counter", "prompt tokens submitted", s["prompt_tokens"]),
            ("generated_tokens_total", "counter", "tokens generated", s["generated_tokens"]),
            ("tokens_per_second", "gauge", "generated tokens/s over the last 10 s", s["tokens_per_second"]),
            ("queue_depth", "gauge", "requests waiting for admission", s["waiting"]),
            ("running_requests", "gauge", "requests prefilling or decoding", s["running"]),
            ("cache_bytes_in_use", "gauge", "live KDA state + MLA latent bytes", s["cache_bytes_in_use"]),
            (
                "cache_bytes_reserved",
                "gauge",
                "bytes reserved by admitted requests",
                s["cache_bytes_reserved"],
            ),
            ("cache_budget_bytes", "gauge", "cache budget", s["cache_budget_bytes"]),
        ]
        for name, kind, help_, v in series:
            n = f"longmoe_{name}"
            lines += [f"# HELP {n} {help_}", f"# TYPE {n} {kind}", f"{n} {v}"]
        lines.append("# TYPE longmoe_finished_requests_total counter")
        for reason in ("stop", "length", "cancelled", "error"):
            lines.append(f'longmoe_finished_requests_total{{reason="{reason}"}} {s[f"finished_{reason}"]}')
        return "\n".join(lines) + "\n"


def create_app(
    engine: Engine,
    model_name: str = "longmoe",
    api_key: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY,
) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name``; ``api_key`` guards every ``/v1`` route."""
    app = FastAPI(title="longmoe", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = _Metrics()
    created = int(time.time())
    app.state.engine = engine

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return JSONResponse(error_body(e), status_code=e.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        msg = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed"}
        err = APIError(e.status_code, msg.get(e.status_code, str(e.detail)), None, None)
        return JSONResponse(error_body(err), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception):
        log.exception("unhandled error on %s", request.url.path)
        err = APIError(500, f"internal error: {type(e).__name__}", None, "internal_error")
        return JSONResponse(error_body(err), status_code=500)

    @app.middleware("http")
    async def _count(request: Request, call_next):
        resp = await call_next(request)
        metrics.count(request.url.path if request.url.path in _ROUTES else "other", resp.status_code)
        return resp

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        auth = request.headers.get("authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(given.encode(), api_key.encode()):
            raise APIError(
                401, "missing or invalid API key (send 'Authorization: Bearer KEY')", None, "invalid_api_key"
            )

    async def read_body(request: Request, cls):
        check_key(request)
        n = request.headers.get("content-length")
        if n is not None and n.isdigit() and int(n) > max_body_bytes:
            raise APIError(413, f"request body of {n} bytes exceeds the limit of {max_body_bytes}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise APIError(413, f"request body exceeds the limit of {max_body_bytes} bytes")
            chunks.append(chunk)
        try:
            data = json.loads(b"".join(chunks))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise APIError(400, f"invalid JSON body: {e}", None, "invalid_json") from None
        try:
            req = cls.model_validate(data)
        except ValidationError as e:
            raise _validation_error(e) from None
        if req.model != model_name:
            raise APIError(
                404, f"the model '{req.model}' does not exist; available: ['{model_name}']", "model",
                "model_not_found",
            )  # fmt: skip
        if req.n != 1:
            raise APIError(400, f"n: only n=1 is supported, got {req.n}", "n", "invalid_value")
        return req

    def submit(ids_or_text, params: SamplingParams):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[Event] = asyncio.Queue()

        def sink(ev: Event) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop is gone (server shutting down)
                loop.call_soon_threadsafe(q.put_nowait, ev)

        try:
            h = engine.submit(ids_or_text, params, sink=sink)
        except EngineError as e:
            code = "context_length_exceeded" if e.param in ("prompt", "max_tokens") else None
            raise APIError(e.status, str(e), e.param, code) from None
        return h, q

    async def next_event(request: Request, h, q: asyncio.Queue) -> Event | None:
        """The next event, or None (after cancelling the request) if the client went away."""
        while True:
            try:
                return await asyncio.wait_for(q.get(), timeout=_POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    h.cancel()
                    return None

    def sampling(req, max_tokens: int, logprobs: bool, top: int) -> SamplingParams:
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=req.temperature,
                top_k=req.top_k,
                top_p=req.top_p,
                seed=req.seed,
                stop=stop,
                stop_token_ids=list(req.stop_token_ids or []),
                repetition_penalty=req.repetition_penalty,
                frequency_penalty=req.frequency_penalty,
                presence_penalty=req.presence_penalty,
                logprobs=logprobs,
                top_logprobs=top,
                ignore_eos=req.ignore_eos,
            )
        except SamplingError as e:
            raise APIError(400, str(e), e.param, "invalid_value") from None

    def usage(c) -> dict:
        return {
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
        }

    def tok_str(i: int) -> str:
        return engine.tokenizer.decode([i])

    def sse(obj: dict | str) -> str:
        return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"

    async def run_request(request: Request, h, q, chunk, final, stream: bool, include_usage: bool):
        """Common tail of both endpoints: stream chunks, or wait and return the full response."""
        if not stream:
            while True:
                ev = await next_event(request, h, q)
                if ev is None:
                    return JSONResponse({"error": "client disconnected"}, status_code=499)
                if ev.done is not None:
                    return JSONResponse(final(ev.done))

        async def gen() -> AsyncIterator[str]:
            done = False
            try:
                first = chunk(None, None)
                if first is not None:
                    yield sse(first)
                while not done:
                    ev = await next_event(request, h, q)
                    if ev is None:
                        return
                    done = ev.done is not None
                    if ev.delta or done:
                        yield sse(chunk(ev.delta, ev.done.finish_reason if done else None))
                    if done and include_usage:
                        yield sse({**chunk("", None), "choices": [], "usage": usage(ev.done)})
                yield sse("[DONE]")
            finally:
                if not done:
                    h.cancel()  # client went away mid-stream: free its cache

        return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # ------------------------------------------------------------------ routes
    @app.get("/health")
    async def health():
        s = engine.stats()
        return {"status": "ok", "model": model_name, "running": s["running"], "waiting": s["waiting"]}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(engine), media_type="text/plain; version=0.0.4")

    @app.get("/", response_class=HTMLResponse)
    async def index():
        return HTMLResponse((STATIC / "index.html").read_text().replace("{{MODEL}}", model_name))

    @app.get("/v1/models")
    async def models(request: Request):
        check_key(request)
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "longmoe"}
        return {"object": "list", "data": [{**card, "max_context": engine.max_context}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        req: CompletionRequest = await read_body(request, CompletionRequest)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                msg = "prompt: batched prompts are not supported; send one per request"
                raise APIError(400, msg, "prompt")
            prompt = prompt[0]
        if req.echo:
            raise APIError(400, "echo: not supported", "echo", "unsupported")
        top = req.logprobs or 0
        params = sampling(req, req.max_tokens, req.logprobs is not None, top)
        h, q = submit(prompt, params)
        rid, t = f"cmpl-{uuid.uuid4().hex}", int(time.time())

        def chunk(delta, finish):
            if delta is None:
                return None
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            head = {"id": rid, "object": "text_completion", "created": t, "model": model_name}
            return {**head, "choices": [choice]}

        def final(c) -> dict:
            lp = None
            if c.logprobs is not None:
                toks = [tok_str(i) for i in c.token_ids]
                offs = [sum(len(x) for x in toks[:k]) for k in range(len(toks))]
                tops = [{tok_str(i): v for i, v in row} for row in c.top_logprobs] if c.top_logprobs else None
                lp = {"tokens": toks, "token_logprobs": c.logprobs, "top_logprobs": tops, "text_offset": offs}
            choice = {"index": 0, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason}
            return {
                "id": rid, "object": "text_completion", "created": t, "model": model_name,
                "choices": [choice], "usage": usage(c),
            }  # fmt: skip

        inc = bool(req.stream_options and req.stream_options.include_usage)
        return await run_request(request, h, q, chunk, final, req.stream, inc)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        req: ChatRequest = await read_body(request, ChatRequest)
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        try:
            ids = engine.encode_chat(messages)
        except EngineError as e:
            raise APIError(400, str(e), e.param) from None
        room = engine.max_context - len(ids)
        max_tokens = req.max_completion_tokens or req.max_tokens or max(1, min(DEFAULT_CHAT_MAX_TOKENS, room))
        params = sampling(req, max_tokens, req.logprobs, req.top_logprobs or 0)
        h, q = submit(ids, params)
        rid, t = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        base = {"id": rid, "object": "chat.completion.chunk", "created": t, "model": model_name}

        def chunk(delta, finish):
            if delta is None:
                d = {"role": "assistant", "content": ""}
            else:
                d = {"content": delta} if delta else {}
            return {**base, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]}

        def final(c) -> dict:
            lp = None
            if c.logprobs is not None:
                rows = c.top_logprobs or [[] for _ in c.token_ids]
                lp = {
                    "content": [
                        {
                            "token": tok_str(i),
                            "logprob": v,
                            "bytes": list(tok_str(i).encode()),
                            "top_logprobs": [
                                {"token": tok_str(a), "logprob": b, "bytes": list(tok_str(a).encode())}
                                for a, b in row
                            ],
                        }  # fmt: skip
                        for i, v, row in zip(c.token_ids, c.logprobs, rows, strict=False)
                    ]
                }
            msg = {"role": "assistant", "content": c.text}
            choice = {"index": 0, "message": msg, "logprobs": lp, "finish_reason": c.finish_reason}
            return {**base, "object": "chat.completion", "choices": [choice], "usage": usage(c)}

        inc = bool(req.stream_options and req.stream_options.include_usage)
        return await run_request(request, h, q, chunk, final, req.stream, inc)

    return app


_ROUTES = {"/", "/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions"}


def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0
) -> tuple[Any, threading.Thread, int]:
    """Start uvicorn on a background thread (tests, benchmarks); returns ``(server, thread, port)``.

    Stop with ``server.should_exit = True; thread.join()``."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
    th = threading.Thread(target=server.run, name="longmoe-http", daemon=True)
    th.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not th.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, th, port
