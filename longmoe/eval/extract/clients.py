"""Backends for structured extraction: any OpenAI-compatible vision endpoint, or a local longmoe model.

Both have ``extract(docs, max_tokens) -> list[Reply]`` and decode greedily. ``inputs="image"`` shows
the page as pixels; ``inputs="text"`` gives the same content as plain text (``Document.text``): a
text-only control (the same content without pixels; how far its gap to the image model says anything
about "reading" depends on how fairly the control was trained, see docs/vision.md).

- ``EndpointExtractClient``: ``POST {url}/v1/chat/completions`` with one user message whose content
  parts are the instruction and ``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``
  (the OpenAI vision format), ``temperature=0``.
- ``LocalExtractClient`` (``eval.extract.local``): a model directory with a vision encoder, prompted the way
  the vision_extract recipe trains it (image span, then the instruction).
"""

from __future__ import annotations

import base64
import io
from typing import Any

from longmoe.eval.clients import ClientError, HTTPEndpoint, Reply
from longmoe.tasks.documents import Document

INPUTS = ("image", "text", "pdf")
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


def pdf_bytes(image: Any) -> bytes:
    """A PIL page image as a one-page PDF, as a scanner writes it (an image, no text layer), one point
    per pixel and lossless (``serve/files/make_pdf.image_pdf``), so the round trip measures the
    server's PDF path, not a JPEG codec."""
    from longmoe.serve.files.make_pdf import image_pdf

    return image_pdf(image)


def pdf_page_image(image: Any) -> Any:
    """The page as a PDF, rendered back by the server's own path (``serve/files/documents.parse``,
    ``pages_as="images"``: pypdfium2, the server's default limits): the image a model gets for a
    real PDF page (``image``'s own pixels up to ``DocumentLimits.render_side`` a side)."""
    from PIL import Image

    from longmoe.serve.files.documents import parse

    doc = parse(pdf_bytes(image), "page.pdf", "application/pdf", pages_as="images")
    return Image.open(io.BytesIO(doc.images[0])).convert("RGB")


def text_prompt(doc: Document) -> str:
    """The text-only control's prompt: the document's content as text, then the instruction."""
    return f"{doc.text}\n\n{ENDPOINT_INSTRUCTION}"


def chat_messages(doc: Document, inputs: str = "image") -> list[dict[str, Any]]:
    """The one user message asking for ``doc``'s JSON, as OpenAI chat content parts."""
    if inputs not in INPUTS:
        raise ClientError(f"inputs={inputs!r} is invalid: expected one of {INPUTS}")
    if inputs == "text":
        return [{"role": "user", "content": text_prompt(doc)}]
    if inputs == "pdf":  # the page as a PDF file part: the server renders it (longmoe's pages_as)
        data = "data:application/pdf;base64," + base64.b64encode(pdf_bytes(doc.image)).decode("ascii")
        part = {"file_data": data, "filename": "page.pdf", "pages_as": "images"}
        return [{"role": "user", "content": [{"type": "file", "file": part},
                                             {"type": "text", "text": ENDPOINT_INSTRUCTION}]}]  # fmt: skip
    content = [
        {"type": "image_url", "image_url": {"url": png_data_uri(doc.image)}},
        {"type": "text", "text": ENDPOINT_INSTRUCTION},
    ]
    return [{"role": "user", "content": content}]


class EndpointExtractClient(HTTPEndpoint):
    """An OpenAI-compatible ``/v1/chat/completions`` that accepts image content parts."""

    def __init__(
        self, url: str, model: str, api_key: str | None = None, inputs: str = "image", **opts: Any
    ) -> None:
        if inputs not in INPUTS:
            raise ClientError(f"inputs={inputs!r} is invalid: expected one of {INPUTS}")
        super().__init__(url, model, "chat/completions", api_key, **opts)
        self.inputs = inputs
        self.name += " (text)" if inputs == "text" else ""

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
        body, choice = self.first_choice(self.post(self.payload(doc, max_tokens)))
        try:
            text = choice["message"]["content"]
        except (KeyError, TypeError) as e:
            raise ClientError(f"{self.url} returned an unexpected body: {body}") from e
        usage = body.get("usage") or {}
        return Reply(text or "", usage.get("prompt_tokens"), usage.get("completion_tokens"))
