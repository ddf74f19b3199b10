"""The one chat + tool-call format: rendering, loss masks and parsing of assistant turns.

Every surface that speaks chat uses this module: SFT and RL (render trajectories, mask the
non-assistant tokens), ``longmoe chat``, the HTTP server (OpenAI function calling) and agent
evaluation (parse what the model wrote). The format, per message::

    <|system|>\\n{content}<|end|>\\n
    <|user|>\\n{content}<|end|>\\n
    <|assistant|>\\n{content}<|tool_call|>{"name": ..., "arguments": {...}}<|end|>\\n
    <|tool_result|>\\n{content}<|end|>\\n

An assistant turn is free text followed by zero or more tool calls; each call is a JSON object with
``name`` and ``arguments`` opened by ``<|tool_call|>`` and closed by the next ``<|tool_call|>`` or by
the turn's ``<|end|>``. So generation always stops at ``<|end|>``, and a turn whose calls list is
empty is a final answer. Tool results come back in order, one ``tool`` message per call.

Tools are shown to the model in the system message: ``render_tools`` turns OpenAI function schemas
into a block of text (one ``- name(arg: type): description`` line per tool, the environments' format)
that ``with_tools`` appends to the first system message
(or makes one); ``render_messages`` and ``encode_chat`` take ``tools=`` and do that, so SFT, RL, the
environments and the server all present tools identically.

Boundaries between messages sit right before a special token, which the tokenizer never merges
across, so encoding message by message gives the same ids as encoding the whole string; that is what
makes the per-token loss mask exact.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from longmoe.data.images import image_span

if TYPE_CHECKING:
    from longmoe.data.tokenizer import Tokenizer
    from longmoe.types import Patches

ROLE_TOKENS = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool_result|>",
}
TOOL_CALL = "<|tool_call|>"
END = "<|end|>"
IMAGE_SPAN = "<|image|><|/image|>"


@dataclass(frozen=True)
class ToolCall:
    """One function call the assistant made: ``arguments`` is always a JSON object (a dict)."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (arguments as a JSON string, as the API specifies)."""
        args = json.dumps(self.arguments, ensure_ascii=False)
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True)
class AssistantTurn:
    """What an assistant turn says: text, then tool calls; ``malformed`` names what could not parse.

    A malformed turn keeps the calls that did parse, but agents and environments treat the turn
    as invalid (the episode ends with reward 0 and the event is counted).
    """

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: str | None = None

    @property
    def is_final(self) -> bool:
        """A well-formed turn without tool calls: the assistant's answer."""
        return self.malformed is None and not self.tool_calls


@dataclass
class ChatTokens:
    """A rendered conversation: ids, and per id whether it is a trained (assistant) token."""

    ids: list[int] = field(default_factory=list)
    assistant_mask: list[bool] = field(default_factory=list)


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones, mark images
        parts = []
        for j, p in enumerate(content):
            if not isinstance(p, dict) or "type" not in p:
                raise ValueError(f"{where}.content[{j}] must be an object with a 'type'")
            parts.append(p.get("text", "") if p["type"] == "text" else IMAGE_SPAN)
        return "".join(parts)
    got = type(content).__name__
    raise ValueError(f"{where}.content must be a string or a list of content parts, got {got}")


def _call_from_message(call: Any, where: str) -> ToolCall:
    """An OpenAI ``tool_calls`` entry (or a bare ``{"name", "arguments"}``) as a ``ToolCall``."""
    if not isinstance(call, dict):
        raise ValueError(f"{where} must be an object")
    fn = call.get("function", call)
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):
            args = json.loads(args) if args.strip() else {}
    if not isinstance(args, dict):
        raise ValueError(f"{where}.function.arguments must be a JSON object (or its string)")
    return ToolCall(name=name, arguments=args, id=call.get("id"))


TOOLS_HEADER = 'Tools (call one with a JSON object {"name": ..., "arguments": {...}}):'


def _tool_function(tool: Any, where: str) -> dict[str, Any]:
    """The ``function`` object of an OpenAI tool (``{"type": "function", "function": {...}}``), or a
    bare ``{"name", "description", "parameters"}``."""
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ValueError(f"{where}.function.name must be a non-empty string")
    return fn


def _type_name(schema: Any) -> str:
    """A parameter's JSON type as the tools block names it (``string``, ``integer|null``, ``any``)."""
    t = schema.get("type") if isinstance(schema, dict) else None
    if isinstance(t, str):
        return t
    if isinstance(t, list) and all(isinstance(x, str) for x in t):
        return "|".join(t)
    return "any"


def render_tools(tools: list[dict[str, Any]]) -> str:
    """The tools block of the system message: a header line, then one line per tool in the given
    order, ``- name(arg: type, ...): description``. Pure: same tools, same text."""
    lines = [TOOLS_HEADER]
    for i, tool in enumerate(tools):
        fn = _tool_function(tool, f"tools[{i}]")
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        args = ", ".join(f"{k}: {_type_name(v)}" for k, v in (props or {}).items())
        desc = fn.get("description")
        lines.append(f"- {fn['name']}({args})" + (f": {desc}" if desc else ""))
    return "\n".join(lines)


def with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` with ``render_tools(tools)`` appended to the first system message (after a blank
    line), or as a new first system message; unchanged without tools, or when the system message
    already ends with that block (an environment's opening messages carry it: rendering them with
    their tools again, as the server does, gives the same prompt SFT and RL trained on)."""
    if not tools:
        return messages
    block = render_tools(tools)
    if messages and isinstance(messages[0], dict) and messages[0].get("role") == "system":
        first = messages[0]
        text = _content_text(first.get("content"), "messages[0]")
        if text.endswith(block):
            return messages
        return [{**first, "content": f"{text}\n\n{block}" if text else block}, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def render_message(message: dict[str, Any], index: int = 0) -> tuple[str, str, str]:
    """One message as ``(head, body, tail)``: the role marker, what the role says, the newline.

    For an assistant message ``body`` (content, calls and the closing ``<|end|>``) is exactly what
    the model generates after ``<|assistant|>\\n``, so it is the part SFT trains on.
    """
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise ValueError(f"{where} must be an object with 'role' and 'content'")
    role = message.get("role")
    if role not in ROLE_TOKENS:
        raise ValueError(f"{where}.role={role!r} is invalid: expected one of {sorted(ROLE_TOKENS)}")
    body = _content_text(message.get("content"), where)
    calls = message.get("tool_calls") or []
    if calls and role != "assistant":
        raise ValueError(f"{where}.tool_calls is only valid on assistant messages (role is {role!r})")
    for j, call in enumerate(calls):
        body += TOOL_CALL + _call_from_message(call, f"{where}.tool_calls[{j}]").to_json()
    return f"{ROLE_TOKENS[role]}\n", body + END, "\n"


def render_messages(
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """OpenAI-style messages -> the model's chat text (ending in ``<|assistant|>\\n`` if asked);
    ``tools`` (OpenAI function schemas) are shown in the system message (``with_tools``)."""
    if not isinstance(messages, list):
        raise ValueError("messages must be a list of objects")
    messages = with_tools(messages, tools)
    out = ["".join(render_message(m, i)) for i, m in enumerate(messages)]
    if add_generation_prompt:
        out.append(ROLE_TOKENS["assistant"] + "\n")
    return "".join(out)


def encode_chat(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = False,
    bos: bool = False,
    tools: list[dict[str, Any]] | None = None,
    images: Sequence[Patches] | None = None,
) -> ChatTokens:
    """Token ids of a conversation with the SFT/RL loss mask: True on assistant bodies only.

    System, user and tool-result tokens and every role marker are context (False). The ids equal
    ``tokenizer.encode(render_messages(...))`` (tested), since each piece starts at a special token.
    ``images``: the ``Patches`` of the conversation's image parts in order; each part becomes its
    image's token span (``<|image|>`` + one ``<|image_patch|>`` per patch + ``<|/image|>``).
    """
    messages = with_tools(messages, tools)
    out = ChatTokens()
    if bos:
        out.ids.append(tokenizer.bos_id)
        out.assistant_mask.append(False)
    spans = _ImageSpans(tokenizer, images)
    for i, m in enumerate(messages):
        head, body, tail = render_message(m, i)
        train = m["role"] == "assistant"
        for text, mask in ((head, False), (body, train), (tail, False)):
            ids = spans.expand(tokenizer.encode(text))
            out.ids += ids
            out.assistant_mask += [mask] * len(ids)
    if add_generation_prompt:
        ids = tokenizer.encode(ROLE_TOKENS["assistant"] + "\n")
        out.ids += ids
        out.assistant_mask += [False] * len(ids)
    spans.check_all_used()
    return out


class _ImageSpans:
    """Replaces each image part's ``IMAGE_SPAN`` (``<|image|><|/image|>``, no patches) by the next
    image's full span (``data.images.image_span``), in order. Text that spells the markers itself
    would shift every later image, so any count other than one span per image is an error."""

    def __init__(self, tokenizer: Tokenizer, images: Sequence[Patches] | None) -> None:
        self.images, self.used = list(images or []), 0
        self.tokenizer = tokenizer
        self.start, self.end = tokenizer.image_start_id, tokenizer.image_end_id

    def expand(self, ids: list[int]) -> list[int]:
        if not self.images or self.start not in ids:
            return ids
        out, i = [], 0
        while i < len(ids):
            if ids[i] == self.start and i + 1 < len(ids) and ids[i + 1] == self.end:
                if self.used == len(self.images):
                    raise ValueError(self._mismatch())
                out += image_span(self.images[self.used], self.tokenizer)
                self.used += 1
                i += 2
            else:
                out.append(ids[i])
                i += 1
        return out

    def check_all_used(self) -> None:
        if self.used != len(self.images):
            raise ValueError(self._mismatch())

    def _mismatch(self) -> str:
        return (
            f"messages: {len(self.images)} image(s) given but the conversation has a different number of "
            "image parts (text must not spell the image marker tokens)"
        )


def parse_assistant(text: str) -> AssistantTurn:
    """Parse what the model generated after ``<|assistant|>\\n`` (decoded with special tokens kept).

    Text after the first ``<|end|>`` is ignored (generation stops there). Each ``<|tool_call|>``
    segment must be a JSON object with a string ``name`` and an object ``arguments``; anything else
    makes the turn malformed, with the reason in ``malformed``.
    """
    text = text.split(END, 1)[0]
    content, *segments = text.split(TOOL_CALL)
    calls: list[ToolCall] = []
    for j, seg in enumerate(segments):
        try:
            obj = json.loads(seg)
        except json.JSONDecodeError as e:
            return AssistantTurn(content, tuple(calls), f"tool call {j}: invalid JSON ({e.msg} at {e.pos})")
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            why = f"tool call {j}: expected an object with a string 'name'"
            return AssistantTurn(content, tuple(calls), why)
        args = obj.get("arguments", {})
        if not isinstance(args, dict):
            return AssistantTurn(content, tuple(calls), f"tool call {j}: 'arguments' must be a JSON object")
        extra = set(obj) - {"name", "arguments"}
        if extra:
            return AssistantTurn(content, tuple(calls), f"tool call {j}: unexpected keys {sorted(extra)}")
        calls.append(ToolCall(obj["name"], args))
    return AssistantTurn(content, tuple(calls))
