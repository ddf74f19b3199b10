"""Backends for structured extraction: any OpenAI-compatible vision endpoint, or a local longmoe model.

Both have ``extract(docs, max_tokens) -> list[Reply]`` and decode greedily. ``inputs="image"`` shows
the page as pixels; ``inputs="text"`` gives the same content as plain text (``Document.text``): the
text-only control, which separates reading pixels from extracting fields.

- ``EndpointExtractClient``: ``POST {url}/v1/chat/completions`` with one user message whose content
  parts are the instruction and ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``
  (the OpenAI vision format), ``temperature=0``.
- ``LocalExtractClient`` (``extract_local``): a model directory with a vision encoder, prompted the way
  the vision_extract recipe trains it (image span, then the instruction).
"""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx

from longmoe.eval.clients import ClientError, Reply
from longmoe.tasks.documents import Document

INPUTS = ("image", "text")
# What a general-purpose endpoint is asked (a local model trained by the recipe gets ``INSTRUCTION``)
ENDPOINT_INSTRUCTION = (
    "Extract every labelled field, item, table row and figure property of this document as one JSON "
    "object (lower-case keys; values as printed, as strings, counts and figure numbers as integers). "
    "Answer with the JSON object only."
)


def png_data_uri(image: Any) -> str:
    """A PIL image as a ``data:image/png;base64,...`` URI (lossless: the page's exact pixels)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def text_prompt(doc: Document) -> str:
    """The text-only control's prompt: the document's content as text, then the instruction."""
    return f"{doc.text}\n\n{ENDPOINT_INSTRUCTION}"


def chat_messages(doc: Document, inputs: str = "image") -> list[dict[str, Any]]:
    """The one user message asking for ``doc``'s JSON, as OpenAI chat content parts."""
    if inputs not in INPUTS:
        raise ClientError(f"inputs={inputs!r} is invalid: expected one of {INPUTS}")
    if inputs == "text":
        return [{"role": "user", "content": text_prompt(doc)}]
    content = [
        {"type": "image_url", "image_url": {"url": png_data_uri(doc.image)}},
        {"type": "text", "text": ENDPOINT_INSTRUCTION},
    ]
    return [{"role": "user", "content": content}]


class EndpointExtractClient:
    """An OpenAI-compatible ``/v1/chat/completions`` that accepts image content parts."""

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        inputs: str = "image",
        timeout: float = 600.0,
        retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ClientError(f"endpoint {url!r} is invalid: expected an http:// or https:// URL")
        if not model:
            raise ClientError("an endpoint needs --api-model (the model name the server expects)")
        if inputs not in INPUTS:
            raise ClientError(f"inputs={inputs!r} is invalid: expected one of {INPUTS}")
        base = url.rstrip("/")
        base = base[: -len("/v1")] if base.endswith("/v1") else base
        self.url, self.model, self.inputs = f"{base}/v1/chat/completions", model, inputs
        self.name = f"{model}@{base}" + (" (text)" if inputs == "text" else "")
        self.retries, self.backoff = retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(timeout=timeout, headers=headers)

    def payload(self, doc: Document, max_tokens: int) -> dict[str, Any]:
        return {
            "model": self.model,
            "messages": chat_messages(doc, self.inputs),
            "max_tokens": max_tokens,
            "temperature": 0.0,
        }

    def extract(self, docs: list[Document], max_tokens: list[int]) -> list[Reply]:
        return [self._one(d, m) for d, m in zip(docs, max_tokens)]

    def _one(self, doc: Document, max_tokens: int) -> Reply:
        body = self.payload(doc, max_tokens)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                r = self.http.post(self.url, json=body)
            except httpx.TransportError as e:  # connection refused/reset, timeout
                last = e
            else:
                if r.status_code == 200:
                    return self._parse(r)
                if r.status_code < 500 and r.status_code != 429:
                    raise ClientError(f"{self.url} answered HTTP {r.status_code}: {r.text[:300]}")
                last = ClientError(f"{self.url} answered HTTP {r.status_code}: {r.text[:200]}")
            if attempt < self.retries:
                time.sleep(min(8.0, self.backoff * 2**attempt))
        raise ClientError(f"{self.url} failed after {self.retries + 1} tries: {last}")

    def _parse(self, r: httpx.Response) -> Reply:
        try:
            body = r.json()
            text = body["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise ClientError(f"{self.url} returned an unexpected body: {r.text[:300]}") from e
        usage = body.get("usage") or {}
        return Reply(text or "", usage.get("prompt_tokens"), usage.get("completion_tokens"))

    def close(self) -> None:
        self.http.close()
