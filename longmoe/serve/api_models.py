"""Request bodies of the OpenAI wire format, as strict pydantic models (unknown fields are errors).

Strict types mean ``"max_tokens": "5"`` or ``"stream": "yes"`` are rejected rather than coerced;
ranges are checked by ``SamplingParams`` so the engine and the server share one set of rules.
longmoe extensions beyond the OpenAI fields: ``top_k``, ``repetition_penalty``, ``stop_token_ids``,
``ignore_eos``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingFields(_Strict):
    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    user: str | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str]
    max_tokens: int = 16
    logprobs: int | None = None  # number of top alternatives per token (OpenAI legacy format)
    echo: bool = False


class ContentPart(_Strict):
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: dict[str, Any] | None = None


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
