"""The part of the completions and chat routes that is the same for both (vLLM's serving_engine):
sampling parameters from the request, submission to the engine off the event loop, and the
response, streamed as server-sent events or returned whole.

A request holds one of its client's slots (``ClientLimiter``) from submission until the engine
reports it done, whatever ends it. A client that goes away cancels its request: a streamed one when
Starlette sees the disconnect (it listens while streaming), a non-streamed one through
``_until_gone``, which waits on the connection while the tokens flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from longmoe.layers.vision import Patches
from longmoe.serve.api.errors import APIError, error_body
from longmoe.serve.api.protocol import GenerationRequest
from longmoe.serve.api.state import server_state
from longmoe.serve.engine import RequestHandle
from longmoe.serve.errors import EngineError
from longmoe.serve.request import Completion, Event
from longmoe.serve.sampling import SamplingError, SamplingParams, TokenConstraint
from longmoe.serve.structured import StructuredOutputError

ChunkFn = Callable[[str, str | None], dict]  # (text delta, finish reason) -> one SSE chunk
FinalFn = Callable[[Completion], dict]  # the completion -> the whole response body
EventsFn = Callable[[Event], list[dict]]  # one event -> the SSE chunks it makes (tool-call streaming)

log = logging.getLogger(__name__)


async def constraint(request: Request, req: GenerationRequest) -> Callable[[], TokenConstraint] | None:
    """The request's ``response_format`` as a token constraint (None for free text), its grammar
    compiled in a worker thread (cached by schema hash); a bad schema is a 400 naming the field."""
    fmt = req.response_format.json_format() if req.response_format is not None else None
    if fmt is None:
        return None
    st = server_state(request)
    try:
        return await asyncio.to_thread(lambda: st.json_grammars().constraint(fmt))
    except StructuredOutputError as e:
        raise APIError(400, str(e), e.param, "invalid_value") from None


def sampling_params(
    req: GenerationRequest,
    max_tokens: int,
    logprobs: bool,
    top: int,
    constraint: Callable[[], TokenConstraint] | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
            stop=req.stop_list(),
            stop_token_ids=list(req.stop_token_ids or []),
            repetition_penalty=req.repetition_penalty,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            logprobs=logprobs,
            top_logprobs=top,
            ignore_eos=req.ignore_eos,
            constraint=constraint,
            prompt_logprobs=prompt_logprobs,
        )
    except SamplingError as e:
        raise APIError(400, str(e), e.param, "invalid_value") from None


def client_id(request: Request) -> str:
    """The key of the per-client cap: the peer address (behind a proxy, the proxy's)."""
    return request.client.host if request.client else "unknown"


async def submit(
    request: Request,
    prompt: str | list[int],
    params: SamplingParams,
    rename: dict[str, str] | None = None,
    images: Sequence[Patches] = (),
    cache_salt: bytes | None = None,
    on_done: Callable[[Completion], None] | None = None,
) -> tuple[RequestHandle, asyncio.Queue[Event]]:
    """Submit to the engine from a worker thread (tokenising a long prompt is CPU work) and return
    the handle and the queue its events arrive on. ``rename`` maps engine field names to the ones
    the client sent (``max_tokens`` -> ``max_completion_tokens``); ``images``: the prompt's images;
    ``on_done``: called with the completion in the engine thread before its last event is queued."""
    st = server_state(request)
    loop = asyncio.get_running_loop()
    q: asyncio.Queue[Event] = asyncio.Queue()
    who = client_id(request)
    st.limiter.acquire(who)
    st.lifecycle.started()  # until its last event (the drain waits for it)
    rec = getattr(request.state, "record", None)  # access.RequestRecord (the AccessLog middleware's)
    start = rec.start if rec is not None else time.monotonic()
    submitted = time.monotonic()
    first: float | None = None

    def sink(ev: Event) -> None:  # engine thread
        nonlocal first
        if first is None and ev.token_ids:
            first = time.monotonic()
            if rec is not None:
                rec.first_token = first
        if ev.done is not None:
            st.limiter.release(who)
            try:
                if on_done is not None:
                    try:
                        on_done(ev.done)
                    except Exception:  # bookkeeping (a cache) never fails the request
                        log.exception("on_done failed")
                _finished(request, rec, start, submitted, first, ev.done)
            finally:
                st.lifecycle.ended()
        with contextlib.suppress(RuntimeError):  # the event loop is gone (server shutting down)
            loop.call_soon_threadsafe(q.put_nowait, ev)

    try:
        h = await asyncio.to_thread(st.engine.submit, prompt, params, sink, None, images, cache_salt)
    except EngineError as e:
        st.limiter.release(who)
        st.lifecycle.ended()
        param = (rename or {}).get(e.param, e.param)
        code = "context_length_exceeded" if e.param in ("prompt", "max_tokens") else None
        raise APIError(e.status, str(e).replace(e.param, param, 1), param, code) from None
    except BaseException:
        st.limiter.release(who)
        st.lifecycle.ended()
        raise
    return h, q


def _finished(
    request: Request, rec, start: float, submitted: float, first: float | None, c: Completion
) -> None:
    """A request's end (engine thread): its histograms, its log record, its trace."""
    st, end = server_state(request), time.monotonic()
    st.prometheus.observe(start, first, end, c)
    if rec is not None:
        rec.completion = c
    if st.tracer is not None:
        rid, route = (rec.id, rec.route) if rec is not None else ("", request.url.path)
        try:  # a broken exporter must never fail the engine's step
            st.tracer.record(rid, route, start, submitted + c.queue_s, first, end, c)
        except Exception:
            log.exception("tracing failed")


def count_error(request: Request, err: APIError) -> None:
    server_state(request).metrics.count_error(err.code or err.type)
    rec = getattr(request.state, "record", None)
    if rec is not None:
        rec.error = err.code or err.type


def failure(c: Completion) -> APIError | None:
    """What a completion the engine ended without an answer is for the client (None: it answered).
    ``finish_reason`` ``"error"`` is no value OpenAI clients know: a failed engine step is a 500 in the
    error shape; a request the engine dropped while closing is a 503 the client may retry."""
    if c.finish_reason == "error":
        detail = c.error or "no detail"
        return APIError(500, f"the engine failed while generating ({detail})", None, "engine_error")
    if c.finish_reason == "cancelled":
        return APIError(503, "the server is shutting down; retry the request", None, "server_shutting_down")
    return None


def usage_of(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's ``usage``: ``prompt_tokens_details.cached_tokens`` counts the prompt tokens the
    engine did not prefill (a prefix snapshot or a session's kept row held them)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage(c: Completion) -> dict:
    return usage_of(c.prompt_tokens, c.completion_tokens, c.cached_tokens)


def sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


async def _until_gone(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next message is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def respond(
    request: Request,
    h: RequestHandle,
    q: asyncio.Queue[Event],
    chunk: ChunkFn,
    final: FinalFn,
    stream: bool,
    include_usage: bool,
    opening: dict | None = None,
    events: EventsFn | None = None,
) -> Response:
    """Stream the request's chunks (after ``opening``, if any), or wait for its completion and
    return the whole response. ``events``, if given, makes the chunks of each event instead of
    ``chunk(delta, finish)``."""
    if not stream:
        return await _whole(request, h, q, final)

    async def gen() -> AsyncIterator[str]:
        done = False
        try:
            if opening is not None:
                yield sse(opening)
            while not done:
                ev = await q.get()
                done = ev.done is not None
                err = failure(ev.done) if ev.done is not None else None
                if err is not None:  # an error event, never a chunk with finish_reason "error"
                    if ev.delta:  # text that made it out before the failure
                        yield sse(chunk(ev.delta, None))
                    count_error(request, err)
                    yield sse(error_body(err))
                    break
                if events is not None:
                    for c in events(ev):
                        yield sse(c)
                elif ev.delta or done:
                    yield sse(chunk(ev.delta, ev.done.finish_reason if ev.done else None))
                if ev.done is not None and include_usage:
                    yield sse({**chunk("", None), "choices": [], "usage": usage(ev.done)})
            yield sse("[DONE]")
        finally:
            if not done:
                h.cancel()  # client went away mid-stream (Starlette cancelled us): free its cache

    return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _whole(request: Request, h: RequestHandle, q: asyncio.Queue[Event], final: FinalFn) -> Response:
    gone = asyncio.ensure_future(_until_gone(request))
    try:
        while True:
            get = asyncio.ensure_future(q.get())
            await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not get.done():
                get.cancel()
                h.cancel()
                return JSONResponse({"error": "client disconnected"}, status_code=499)
            ev = get.result()
            if ev.done is not None:
                err = failure(ev.done)
                if err is not None:
                    count_error(request, err)
                    raise err
                return JSONResponse(final(ev.done))
    finally:
        gone.cancel()
