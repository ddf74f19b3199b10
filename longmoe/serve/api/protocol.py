"""Request bodies of the OpenAI wire format, as strict pydantic models (unknown fields are errors).

Strict types mean ``"max_tokens": "5"`` or ``"stream": "yes"`` are rejected rather than coerced;
sampling ranges are checked by ``SamplingParams`` so the engine and the server share one set of
rules, except where the API is narrower than the engine: ``temperature`` in [0, 2] and at most
``MAX_STOP_STRINGS`` stop strings of at most ``MAX_STOP_CHARS`` characters each, as OpenAI.
longmoe extensions beyond the OpenAI fields: ``top_k``, ``repetition_penalty``, ``stop_token_ids``,
``ignore_eos``, and ``response_format`` on ``/v1/completions`` (OpenAI has it on chat only).
Function calling: ``tools`` (at most ``MAX_TOOLS`` function schemas with unique names) and
``tool_choice`` (``none`` | ``auto`` | ``required`` | ``{"type": "function", "function": {"name"}}``),
checked by ``ChatRequest.tool_mode``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from longmoe.serve.api.errors import APIError, echo
from longmoe.serve.structured import JsonFormat

MAX_STOP_STRINGS = 4  # OpenAI: "up to 4 sequences"
MAX_STOP_CHARS = 256
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]; the engine itself accepts more
MAX_TOOLS = 128  # OpenAI's cap on functions per request
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"  # OpenAI's rule for function names
TOOL_CHOICES = ("none", "auto", "required")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    """OpenAI's ``response_format.json_schema``: ``{"name", "schema", "strict", "description"}``."""

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """``{"type": "text" | "json_object"}`` or ``{"type": "json_schema", "json_schema": {...}}``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def json_format(self) -> JsonFormat | None:
        """What the output must match (None: free text); 400 naming ``response_format`` when the
        type and ``json_schema`` disagree."""
        if self.type != "json_schema":
            if self.json_schema is not None:
                msg = f"response_format.json_schema: only allowed with type 'json_schema', not '{self.type}'"
                raise APIError(400, msg, "response_format", "invalid_value")
            return JsonFormat() if self.type == "json_object" else None
        if self.json_schema is None:
            msg = "response_format.json_schema: required when type is 'json_schema'"
            raise APIError(400, msg, "response_format", "invalid_value")
        return JsonFormat(self.json_schema.schema_ or {"type": "object"})


class GenerationRequest(_Strict):
    """The fields completions and chat share."""

    model: str
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)
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
    response_format: ResponseFormat | None = None

    def stop_list(self) -> list[str]:
        """``stop`` as a list, within the API's caps (400 naming ``stop`` otherwise)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > MAX_STOP_STRINGS:
            msg = f"stop: at most {MAX_STOP_STRINGS} stop strings, got {len(stop)}"
            raise APIError(400, msg, "stop", "invalid_value")
        for s in stop:
            if len(s) > MAX_STOP_CHARS:
                msg = f"stop: each stop string has at most {MAX_STOP_CHARS} characters, got {len(s)}"
                raise APIError(400, msg, "stop", "invalid_value")
        return stop

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(GenerationRequest):
    # one prompt: text or token ids; a list of them is a batch (echo scoring only: max_tokens 0 or 1)
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = 16  # 0 only with echo: score the prompt, generate nothing
    logprobs: int | None = None  # number of top alternatives per token (OpenAI legacy format)
    echo: bool = False  # return the prompt (and with logprobs, its tokens' log-probs) before the completion


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (vLLM's fields)."""

    prompt: str
    add_special_tokens: bool = False  # True: the <|bos|> a text prompt gets in /v1/completions
    model: str | None = None


class DetokenizeRequest(_Strict):
    """``POST /detokenize``."""

    tokens: list[int] = Field(max_length=1 << 20)
    model: str | None = None


class ImageURL(_Strict):
    """``image_url`` of a content part: a ``data:`` URI (``serve/images.py`` checks it); ``detail`` is
    accepted for compatibility and ignored (every image is scaled to the model's ``max_image_side``)."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class FileRef(_Strict):
    """``file`` of a content part (OpenAI's): an uploaded ``file_id``, or the file inline as
    ``file_data`` (a ``data:<type>;base64,...`` URI) with its ``filename``. longmoe's extension
    ``pages_as``: ``auto`` (a PDF's text layer; pages without one as images), ``text``, ``images``
    (every page rendered; inline files only, an uploaded file keeps what its upload made)."""

    file_id: str | None = None
    file_data: str | None = None
    filename: str | None = None
    pages_as: Literal["auto", "text", "images"] | None = None


class ContentPart(_Strict):
    type: Literal["text", "image_url", "file"]
    text: str | None = None
    image_url: ImageURL | str | None = None  # a plain string is accepted as the URL
    file: FileRef | None = None


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # what an OpenAI response's assistant message also carries, accepted when it is sent back (ignored)
    refusal: str | None = None
    annotations: list[dict[str, Any]] | None = None


class FunctionDef(_Strict):
    """``tools[i].function``: a name, what it does, its arguments as a JSON Schema object."""

    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``: call exactly this tool."""

    type: Literal["function"]
    function: FunctionName


class ChatRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    def tool_mode(self) -> tuple[str, str | None]:
        """``(mode, name)``: mode ``none`` | ``auto`` | ``required``, and the function a named
        ``tool_choice`` asks for (mode ``required``). Defaults as OpenAI: ``auto`` with tools,
        ``none`` without. Every inconsistency is a 400 naming the field."""
        tools = self.tools or []
        names: set[str] = set()
        for i, t in enumerate(tools):
            if t.function.name in names:
                msg = f"tools.{i}.function.name: duplicate function name '{t.function.name}'"
                raise APIError(400, msg, f"tools.{i}.function.name", "invalid_value")
            names.add(t.function.name)
            params = t.function.parameters
            if params is not None and params.get("type", "object") != "object":
                msg = f"tools.{i}.function.parameters: expected a JSON Schema of type 'object'"
                raise APIError(400, msg, f"tools.{i}.function.parameters", "invalid_value")
        for i, m in enumerate(self.messages):
            if m.role == "tool" and not m.tool_call_id:
                msg = f"messages.{i}.tool_call_id: required on messages with role 'tool'"
                raise APIError(400, msg, f"messages.{i}.tool_call_id", "invalid_value")
        choice = self.tool_choice
        if choice is None:
            return ("auto" if tools else "none"), None
        if not tools and choice != "none":
            msg = "tool_choice: only allowed when tools are given"
            raise APIError(400, msg, "tool_choice", "invalid_value")
        if isinstance(choice, NamedToolChoice):
            name = choice.function.name
            if name not in names:
                msg = f"tool_choice.function.name: no tool named '{echo(name)}' in tools"
                raise APIError(400, msg, "tool_choice.function.name", "invalid_value")
            return "required", name
        return choice, None

    def token_limit(self) -> tuple[str, int | None]:
        """The field that sets the completion length (``max_completion_tokens`` wins, as OpenAI) and
        its value; None when unset. 0 or less is a 400, as OpenAI: it never means "unset"."""
        for name in ("max_completion_tokens", "max_tokens"):
            v = getattr(self, name)
            if v is not None:
                if v < 1:
                    raise APIError(400, f"{name}: expected an integer >= 1, got {v}", name, "invalid_value")
                return name, v
        return "max_tokens", None


def model_not_found(name: str, available: str) -> APIError:
    msg = f"the model '{echo(name)}' does not exist; available: ['{echo(available)}']"
    return APIError(404, msg, "model", "model_not_found")
