"""``POST /v1/chat/completions``: messages (and tools) through the tokenizer's chat template.

Function calling (``tools``, ``tool_choice``, ``tool_calls`` in the message and in stream deltas)
is ``serve/api/tools.py``.

File content parts (uploaded ``file_id`` or inline ``file_data``) become one document message at
the start of the prompt (``serve/api/chat_files.py``). Image content parts (data URIs,
``serve/images.py``) are checked and decoded in a worker thread and become their token spans; any
refusal is a 400 naming the part (``messages.1.content.0.image_url``).

Without ``max_completion_tokens`` / ``max_tokens`` a reply may take ``DEFAULT_CHAT_MAX_TOKENS`` or
what the context has left; 0 is a 400 (as OpenAI), never "unset"."""

from __future__ import annotations

import asyncio
import time
import uuid

from starlette.requests import Request
from starlette.responses import Response

from longmoe.serve.api.chat_files import attach_documents
from longmoe.serve.api.errors import APIError
from longmoe.serve.api.generation import constraint, respond, sampling_params, submit, usage
from longmoe.serve.api.intake import read_request
from longmoe.serve.api.protocol import ChatRequest
from longmoe.serve.api.state import server_state
from longmoe.serve.api.tools import ToolStream, assistant_message, tool_plan
from longmoe.serve.errors import EngineError
from longmoe.serve.images import ImageInputError, chat_patches
from longmoe.serve.reply_ids import encode_chat_with_replies
from longmoe.serve.request import Completion

DEFAULT_CHAT_MAX_TOKENS = 512


async def create_chat_completion(request: Request) -> Response:
    st = server_state(request)
    engine = st.engine
    req = await read_request(request, ChatRequest)
    limit_field, max_tokens = req.token_limit()
    plan = await tool_plan(request, req)
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    messages, salt = await asyncio.to_thread(attach_documents, st, request.state.owner, messages)
    replies = st.replies if engine.cfg.prefix_cache else None  # kept ids serve only the prefix cache
    try:  # decoding images and tokenising are CPU work: off the loop
        images = await asyncio.to_thread(
            chat_patches, messages, engine.cfg.image_limits, engine.model.cfg.vision
        )
        if images:
            ids = await asyncio.to_thread(engine.encode_chat, messages, plan.tools or None, images)
        else:  # earlier replies as the ids they were generated as (serve/reply_ids.py)
            ids = await asyncio.to_thread(
                encode_chat_with_replies, engine.tokenizer, messages, plan.tools or None,
                engine.cfg.add_bos, replies, salt,
            )  # fmt: skip
    except ImageInputError as e:
        raise APIError(400, str(e), e.param, "invalid_image") from None
    except EngineError as e:
        raise APIError(400, str(e), e.param) from None
    except (ValueError, AttributeError, TypeError) as e:  # the template refused a message
        raise APIError(400, str(e), "messages") from None
    if max_tokens is None:
        max_tokens = max(1, min(DEFAULT_CHAT_MAX_TOKENS, engine.max_context - len(ids)))

    def keep_reply(c: Completion, prompt: list[int]) -> None:
        if c.finish_reason in ("stop", "length") and replies is not None:
            msg, _ = assistant_message(engine.tokenizer, c, plan)
            if isinstance(msg.get("content"), str) and not msg.get("tool_calls"):
                replies.keep(engine.tokenizer, salt, prompt, msg["content"], c.token_ids)

    fmt = plan.constraint or await constraint(request, req)
    params = sampling_params(req, max_tokens, req.logprobs, req.top_logprobs or 0, fmt)
    h, q = await submit(
        request,
        ids,
        params,
        rename={"max_tokens": limit_field, "images": "messages"},
        images=images,
        cache_salt=salt,
        on_done=None if replies is None else lambda c: keep_reply(c, ids),
    )

    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
    }
    base["model"] = st.config.model_name
    decode = engine.tokenizer.decode

    def delta_chunk(d: dict, finish: str | None) -> dict:
        return {**base, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}]}

    def chunk(delta: str, finish: str | None) -> dict:
        return delta_chunk({"content": delta} if delta else {}, finish)

    def token(i: int) -> dict:
        s = decode([i])
        return {"token": s, "bytes": list(s.encode())}

    def final(c: Completion) -> dict:
        lp = None
        if c.logprobs is not None:
            rows = c.top_logprobs or [[] for _ in c.token_ids]
            lp = {
                "content": [
                    {**token(i), "logprob": v, "top_logprobs": [{**token(a), "logprob": b} for a, b in row]}
                    for i, v, row in zip(c.token_ids, c.logprobs, rows, strict=False)
                ]
            }
        msg, finish = assistant_message(engine.tokenizer, c, plan)
        choice = {"index": 0, "message": msg, "logprobs": lp, "finish_reason": finish}
        return {**base, "object": "chat.completion", "choices": [choice], "usage": usage(c)}

    opening = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}]}  # fmt: skip
    events = ToolStream(engine.tokenizer, plan, delta_chunk) if plan.parses else None
    return await respond(request, h, q, chunk, final, req.stream, req.include_usage, opening, events)
