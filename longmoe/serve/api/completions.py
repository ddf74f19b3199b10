"""``POST /v1/completions``: a text or token-id prompt, the legacy completions format."""

from __future__ import annotations

import time
import uuid

from starlette.requests import Request
from starlette.responses import Response

from longmoe.serve.api.errors import APIError
from longmoe.serve.api.generation import respond, sampling_params, submit, usage
from longmoe.serve.api.intake import read_request
from longmoe.serve.api.protocol import CompletionRequest
from longmoe.serve.api.state import server_state
from longmoe.serve.request import Completion


async def create_completion(request: Request) -> Response:
    st = server_state(request)
    req = await read_request(request, CompletionRequest)
    prompt = req.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "prompt: batched prompts are not supported; send one per request", "prompt")
        prompt = prompt[0]
    if req.echo:
        raise APIError(400, "echo: not supported", "echo", "unsupported")
    params = sampling_params(req, req.max_tokens, req.logprobs is not None, req.logprobs or 0)
    h, q = await submit(request, prompt, params)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
    head["model"] = st.config.model_name
    decode = st.engine.tokenizer.decode

    def chunk(delta: str, finish: str | None) -> dict:
        return {**head, "choices": [{"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}]}

    def final(c: Completion) -> dict:
        lp = None
        if c.logprobs is not None:
            toks = [decode([i]) for i in c.token_ids]
            offs = [sum(len(x) for x in toks[:k]) for k in range(len(toks))]
            tops = [{decode([i]): v for i, v in row} for row in c.top_logprobs] if c.top_logprobs else None
            lp = {"tokens": toks, "token_logprobs": c.logprobs, "top_logprobs": tops, "text_offset": offs}
        choice = {"index": 0, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason}
        return {**head, "choices": [choice], "usage": usage(c)}

    return await respond(request, h, q, chunk, final, req.stream, req.include_usage)
