"""``longmoe eval extract --extract-input pdf``: the rendered page written as a PDF (an image, no
text layer) goes through the server's own PDF path (``serve/files/documents.parse``, rendered by
pypdfium2): locally, and to a real longmoe vision server as an inline ``file`` content part."""

from __future__ import annotations

import base64

import pytest
from PIL import Image

from longmoe.data.images import patchify
from longmoe.eval.extract.clients import EndpointExtractClient, chat_messages, pdf_page_image
from longmoe.serve.api import create_app
from longmoe.serve.engine import Engine
from longmoe.serve.files.documents import parse
from longmoe.tasks.documents import render
from tests.helpers.server import serving

pytest.importorskip("pypdfium2")


def test_pdf_part_holds_the_page_and_renders_back_to_it():
    d = render("form_easy", 5)
    (msg,) = chat_messages(d, "pdf")
    part = next(p for p in msg["content"] if p["type"] == "file")["file"]
    head, b64 = part["file_data"].split(",", 1)
    assert head == "data:application/pdf;base64" and part["pages_as"] == "images"
    doc = parse(base64.b64decode(b64), "page.pdf", "application/pdf", pages_as="images")
    assert doc.kind == "pdf" and len(doc.pages) == 1 and list(doc.images) == [0]
    back = pdf_page_image(d.image)
    w, h = d.image.size
    assert abs(back.size[0] / back.size[1] - w / h) < 0.02  # same page shape
    small = back.resize(d.image.size, Image.Resampling.BILINEAR).convert("L")
    diff = sum(abs(a - b) for a, b in zip(small.tobytes(), d.image.convert("L").tobytes(), strict=True))
    assert diff / (w * h) < 24  # the same page: grey levels within ~10% on average after resampling


@pytest.mark.slow(wall="not measured")
def test_vision_server_reads_a_pdf_page(vision_dir):
    engine = Engine.from_dir(vision_dir)
    try:
        with serving(create_app(engine, model_name="tiny-vision")) as url:
            c = EndpointExtractClient(url, "tiny-vision", inputs="pdf")
            page = render("form_easy", 7)
            (reply,) = c.extract([page], [4])
            c.close()
        patches = patchify(pdf_page_image(page.image), engine.model.cfg.vision).n
    finally:
        engine.close()
    assert reply.prompt_tokens is not None and reply.prompt_tokens > patches + 2  # the page's span is in it
