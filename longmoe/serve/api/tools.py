"""OpenAI function calling in ``/v1/chat/completions``: the request's tool plan, the assistant
message with ``tool_calls``, and the streamed deltas.

- The tools are shown to the model in the system message (``longmoe.data.chat.render_tools``).
- ``tool_choice``: ``auto`` decodes freely and parses what the model wrote; ``required`` and a named
  function are enforced by grammar-constrained decoding (``longmoe.serve.tool_calls``): exactly one
  valid call; ``none`` keeps the model from opening a call.
- The generated ids are decoded with special tokens kept and parsed with ``parse_assistant``. A
  well-formed turn with calls becomes ``message.tool_calls`` (ids ``call_...``, arguments as JSON
  strings), the text before the first call ``message.content`` (null if empty) and the finish reason
  ``tool_calls``. A malformed call is returned as what it is, plain text: ``content`` holds the
  generated text (special tokens dropped), the finish reason stays ``stop`` / ``length``, as a server
  does whose model wrote no parsable call.
- Streaming: the text before the first ``<|tool_call|>`` streams as ``content`` deltas; from that
  token on the turn is held back until the model stops, then parsed like a whole response and sent
  as one ``tool_calls`` delta per call (``index``, ``id``, ``type``, ``function.name`` and the whole
  ``function.arguments``) and a last chunk with ``finish_reason: "tool_calls"``; a malformed turn is
  sent as ``content`` instead. The marker tokens never reach ``content``, and a streamed response
  always equals the whole one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from longmoe.data.chat import TOOL_CALL, parse_assistant
from longmoe.data.tokenizer import Tokenizer
from longmoe.serve.api.errors import APIError
from longmoe.serve.api.protocol import ChatRequest
from longmoe.serve.api.state import server_state
from longmoe.serve.request import Completion, Event
from longmoe.serve.sampling import TokenConstraint
from longmoe.serve.structured import StructuredOutputError
from longmoe.serve.tool_calls import forced_call, no_call

DeltaFn = Callable[[dict[str, Any], str | None], dict]  # (delta, finish reason) -> one SSE chunk


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolPlan:
    """What a chat request asks of function calling."""

    mode: str = "none"  # none | auto | required
    name: str | None = None  # the one function a named tool_choice allows
    tools: list[dict[str, Any]] = field(default_factory=list)  # OpenAI tool objects, as sent
    parallel: bool = True
    constraint: Callable[[], TokenConstraint] | None = None  # enforces the mode while decoding

    @property
    def parses(self) -> bool:
        """Whether generated text is parsed for calls (tools were given and may be called)."""
        return bool(self.tools) and self.mode != "none"


async def tool_plan(request: Request, req: ChatRequest) -> ToolPlan:
    """Validate ``tools`` / ``tool_choice`` (400s name the field) and build the decoding constraint
    (its grammar compiled in a worker thread)."""
    mode, name = req.tool_mode()
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    plan = ToolPlan(mode, name, tools, req.parallel_tool_calls)
    if not tools:
        return plan
    st = server_state(request)
    call = st.engine.tokenizer.token_to_id(TOOL_CALL)
    assert call is not None  # every longmoe tokenizer has it (checked on load)
    json_fmt = req.response_format is not None and req.response_format.type != "text"
    if mode == "required":
        if json_fmt:
            msg = "tool_choice: a required tool call cannot be combined with a JSON response_format"
            raise APIError(400, msg, "tool_choice", "invalid_value")
        try:
            plan.constraint = await asyncio.to_thread(forced_call, st.json_grammars(), call, tools, name)
        except StructuredOutputError as e:
            msg = f"tools: cannot enforce tool_choice, a parameters schema does not compile ({e})"
            raise APIError(400, msg, "tools", "invalid_value") from None
    elif mode == "none" and not json_fmt:  # a JSON grammar already excludes every special token
        plan.constraint = no_call(call)
    return plan


def assistant_message(tokenizer: Tokenizer, c: Completion, plan: ToolPlan) -> tuple[dict[str, Any], str]:
    """The response's ``message`` and ``finish_reason`` (see the module docstring)."""
    call = tokenizer.token_to_id(TOOL_CALL)
    if plan.parses and call in c.token_ids:
        turn = parse_assistant(tokenizer.decode(c.token_ids, skip_special_tokens=False))
        if turn.tool_calls and turn.malformed is None:
            k = c.token_ids.index(call)
            content = tokenizer.decode(c.token_ids[:k], skip_special_tokens=True)
            calls = turn.tool_calls if plan.parallel else turn.tool_calls[:1]
            msg = {"role": "assistant", "content": content or None}
            msg["tool_calls"] = [tc.to_openai(call_id()) for tc in calls]
            return msg, "tool_calls"
    return {"role": "assistant", "content": c.text}, c.finish_reason


class ToolStream:
    """Turns one request's events into chat chunks, holding back everything from the first
    ``<|tool_call|>`` on until the turn is complete (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, plan: ToolPlan, chunk: DeltaFn) -> None:
        self.tokenizer, self.plan, self.chunk = tokenizer, plan, chunk
        self.call = tokenizer.token_to_id(TOOL_CALL)
        self.in_call = False
        self.sent = ""  # content streamed so far

    def _content(self, text: str, finish: str | None = None) -> list[dict]:
        self.sent += text
        return [self.chunk({"content": text}, finish)] if text or finish else []

    def __call__(self, ev: Event) -> list[dict]:
        out: list[dict] = []
        if not self.in_call:  # this event's text precedes any marker among its tokens (decodes to "")
            self.in_call = self.call in ev.token_ids
            if ev.done is None:
                return self._content(ev.delta)
        if ev.done is None:
            return out
        msg, finish = assistant_message(self.tokenizer, ev.done, self.plan)
        text = msg["content"] or ""
        rest = text[len(self.sent) :] if text.startswith(self.sent) else ""
        if "tool_calls" not in msg:
            return self._content(rest, finish)
        out += self._content(rest)
        for i, tc in enumerate(msg["tool_calls"]):
            out.append(self.chunk({"tool_calls": [{"index": i, **tc}]}, None))
        out.append(self.chunk({}, finish))
        return out
