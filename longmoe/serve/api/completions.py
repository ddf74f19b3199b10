"""``POST /v1/completions``: a text or token-id prompt, the legacy completions format.

``echo`` returns the prompt before the completion, and with ``logprobs`` the log-probability of every
prompt token given the ones before it (``token_logprobs[0]`` is null), computed by the engine as part
of the request (``SamplingParams.prompt_logprobs``: the prompt is prefilled with every position's
logits, in the engine's own steps); ``max_tokens: 0`` then scores without generating. This is what
lm-evaluation-harness's ``local-completions`` backend sends for log-likelihood tasks (``echo``,
``logprobs: 1``, ``max_tokens: 1``, the prompt as a batch of one token-id list). A batch of several
prompts is accepted for echo requests only (not streamed), one choice per prompt.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from longmoe.serve.api.errors import APIError
from longmoe.serve.api.generation import (
    constraint,
    count_error,
    failure,
    respond,
    sampling_params,
    submit,
    usage,
    usage_of,
)
from longmoe.serve.api.intake import read_request
from longmoe.serve.api.protocol import CompletionRequest
from longmoe.serve.api.state import ServerState, server_state
from longmoe.serve.errors import EngineError
from longmoe.serve.request import Completion
from longmoe.serve.sampling import SamplingParams, TokenConstraint


def _prompts(req: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts: one, or a batch (a list of strings or of token-id lists)."""
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], str | list):
        if any(isinstance(x, list) and not x for x in p):
            raise APIError(400, "prompt: empty prompt in the batch", "prompt", "invalid_value")
        return list(p)
    return [p]  # type: ignore[list-item]


def _by_text(decode: Callable[[list[int]], str], row: list[tuple[int, float]]) -> dict[str, float]:
    """OpenAI's legacy ``top_logprobs`` entry ``{token text: logprob}``; ids that decode to the same text
    (broken UTF-8 pieces) keep the most likely one."""
    out: dict[str, float] = {}
    for i, v in row:
        out.setdefault(decode([i]), v)
    return out


def _logprobs(st: ServerState, ids: list[int], lps: list, tops: list | None) -> dict:
    decode = st.engine.tokenizer.decode
    toks = [decode([i]) for i in ids]
    offs = [sum(len(x) for x in toks[:k]) for k in range(len(toks))]
    top = None if tops is None else [None if r is None else _by_text(decode, r) for r in tops]
    return {"tokens": toks, "token_logprobs": lps, "top_logprobs": top, "text_offset": offs}


def _join(a: dict, b: dict, shift: int) -> dict:
    """The prompt's logprobs ``a`` followed by the completion's ``b`` (offsets moved by ``shift``)."""
    tops = None if a["top_logprobs"] is None else a["top_logprobs"] + (b["top_logprobs"] or [])
    return {
        "tokens": a["tokens"] + b["tokens"],
        "token_logprobs": a["token_logprobs"] + b["token_logprobs"],
        "top_logprobs": tops,
        "text_offset": a["text_offset"] + [o + shift for o in b["text_offset"]],
    }


def _completion_logprobs(st: ServerState, c: Completion) -> dict | None:
    if c.logprobs is None:
        return None
    return _logprobs(st, c.token_ids, c.logprobs, c.top_logprobs)


def _params(
    req: CompletionRequest,
    max_tokens: int,
    fmt: Callable[[], TokenConstraint] | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """The sampling parameters; the engine's ``top_logprobs`` and ``prompt_logprobs`` are this API's
    ``logprobs`` in errors."""
    try:
        return sampling_params(
            req, max_tokens, req.logprobs is not None, req.logprobs or 0, fmt, prompt_logprobs
        )
    except APIError as e:
        if e.param not in ("top_logprobs", "prompt_logprobs"):
            raise
        raise APIError(e.status, e.message.replace(e.param, "logprobs", 1), "logprobs", e.code) from None


async def _generate(request: Request, ids: list[int], params: SamplingParams) -> Completion:
    """Run one completion to its end (echo batches: no streaming)."""
    h, q = await submit(request, ids, params)
    try:
        while (ev := await q.get()).done is None:
            pass
    except BaseException:
        h.cancel()
        raise
    err = failure(ev.done)
    if err is not None:
        count_error(request, err)
        raise err
    return ev.done


async def _echo(
    request: Request,
    st: ServerState,
    req: CompletionRequest,
    head: dict,
    fmt: Callable[[], TokenConstraint] | None,
) -> Response:
    """Each prompt is one engine request that scores it (``prompt_logprobs``) and generates
    ``max_tokens`` after it; its lengths are checked by the engine, as any request's."""
    if req.stream:
        raise APIError(400, "echo: not supported together with stream", "echo", "unsupported")
    # scored even without logprobs when nothing is generated: the engine then checks the prompt
    scored = (req.logprobs or 0) if req.logprobs is not None or req.max_tokens == 0 else None
    params = _params(req, req.max_tokens, fmt, scored)
    choices, n_prompt, n_out, n_cached = [], 0, 0, 0
    for index, prompt in enumerate(_prompts(req)):
        try:
            ids = await asyncio.to_thread(st.engine.encode_prompt, prompt)
        except (EngineError, ValueError) as e:
            raise APIError(400, f"prompt: {e}", "prompt", "invalid_value") from None
        c = await _generate(request, ids, params)
        text = prompt if isinstance(prompt, str) else st.engine.tokenizer.decode(ids)
        lp = None
        if req.logprobs is not None:
            assert c.prompt_logprobs is not None
            lp = _logprobs(st, ids, c.prompt_logprobs, c.prompt_top_logprobs if req.logprobs else None)
        finish, n_prompt = "length", n_prompt + len(ids)
        if req.max_tokens > 0:
            text, finish, n_out = text + c.text, c.finish_reason, n_out + c.completion_tokens
            n_cached += c.cached_tokens
            more = _completion_logprobs(st, c)
            if lp is not None and more is not None:
                lp = _join(lp, more, len(text) - len(c.text))
        choices.append({"index": index, "text": text, "logprobs": lp, "finish_reason": finish})
    return JSONResponse({**head, "choices": choices, "usage": usage_of(n_prompt, n_out, n_cached)})


async def create_completion(request: Request) -> Response:
    st = server_state(request)
    req = await read_request(request, CompletionRequest)
    if req.max_tokens < (0 if req.echo else 1):
        lo = "0 with echo" if req.echo else "1 (0 only with echo: score the prompt without generating)"
        raise APIError(400, f"max_tokens: expected an integer >= {lo}, got {req.max_tokens}", "max_tokens")
    fmt = await constraint(request, req)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
    head["model"] = st.config.model_name
    if req.echo:
        return await _echo(request, st, req, head, fmt)
    prompts = _prompts(req)
    if len(prompts) != 1:
        raise APIError(
            400, "prompt: batched prompts are supported with echo only; send one per request", "prompt"
        )
    h, q = await submit(request, prompts[0], _params(req, req.max_tokens, fmt))

    def chunk(delta: str, finish: str | None) -> dict:
        return {**head, "choices": [{"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}]}

    def final(c: Completion) -> dict:
        choice = {
            "index": 0,
            "text": c.text,
            "logprobs": _completion_logprobs(st, c),
            "finish_reason": c.finish_reason,
        }
        return {**head, "choices": [choice], "usage": usage(c)}

    return await respond(request, h, q, chunk, final, req.stream, req.include_usage)
