"""The OpenAI error object ``{"error": {"message", "type", "param", "code"}}`` and the one exception
every handler raises to produce it.

Error bodies are rendered with ``ensure_ascii=True`` so that no client input echoed into a message
(a model name, a path) can make rendering fail, and anything echoed is shortened first.
"""

from __future__ import annotations

import json

from pydantic import ValidationError
from starlette.responses import Response

ECHO_CHARS = 64  # longest piece of client input repeated in an error message

_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


class APIError(Exception):
    """A request the server refuses; ``param`` names the field at fault, ``close`` asks the client to
    open a new connection (set when the request body was not read to its end)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.close = status, message, param, code, close
        default = "invalid_request_error" if status < 500 else "server_error"
        self.type = _TYPES.get(status, default)


def echo(text: str, limit: int = ECHO_CHARS) -> str:
    """Client input made safe to quote: at most ``limit`` characters, printable ASCII escapes."""
    short = text if len(text) <= limit else text[:limit] + "..."
    return short.encode("ascii", "backslashreplace").decode("ascii")


def error_body(e: APIError) -> dict[str, dict[str, str | None]]:
    return {"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}}


def error_response(e: APIError, close: bool = False) -> Response:
    """The error as a JSON response; ``Connection: close`` when the error or the caller asks for it."""
    headers = {"Connection": "close"} if e.close or close else None
    body = json.dumps(error_body(e), ensure_ascii=True).encode()
    return Response(body, status_code=e.status, media_type="application/json", headers=headers)


_TYPE_TAGS = {
    "str",
    "int",
    "float",
    "bool",
    "list",
    "dict",
    "none",
    "StreamOptions",
    "ContentPart",
    "ImageURL",
    "NamedToolChoice",
}


def _field_path(loc: tuple[int | str, ...]) -> list[int | str]:
    """A pydantic error location without the union-member tags (``str``, ``list[int]``, ...)."""
    return [x for x in loc if isinstance(x, int) or not (x in _TYPE_TAGS or "[" in x or "-" in x)]


def validation_error(e: ValidationError) -> APIError:
    """The failing field of a pydantic error (the deepest, ties: the first) as one readable sentence."""
    errs = e.errors(include_url=False)
    # the most specific failure: for a union (``content``: a string or parts) the branch that got
    # deepest names the field at fault (``messages.0.content.1.image_url.url``), not the union itself
    first = max(errs, key=lambda x: len(_field_path(x["loc"])))
    loc = _field_path(first["loc"])
    param = echo(".".join(str(x) for x in loc)) or None
    if first["type"] == "extra_forbidden":
        return APIError(400, f"unknown field '{param}'", param, "unknown_field")
    if not loc:
        return APIError(400, "request body: expected a JSON object", None, "invalid_type")
    same = [x for x in errs if _field_path(x["loc"]) == loc]
    msgs = list(dict.fromkeys(x["msg"] for x in same))
    msg = msgs[0] if len(msgs) == 1 else "invalid value (" + "; or ".join(msgs[:3]) + ")"
    return APIError(400, f"{param}: {msg}", param, "invalid_value")
