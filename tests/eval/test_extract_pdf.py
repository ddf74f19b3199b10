"""``longmoe eval extract --extract-input pdf``: the rendered page written as a PDF (an image, no
text layer) goes through the server's own PDF path (``serve/files/documents.parse``, rendered by
pypdfium2): locally, and to a real longmoe vision server as an inline ``file`` content part. A page
written at one point per pixel renders back to its own pixels (never enlarged), so the model's
resize treats it as the image and reads the same patches (exactly, for the lossless PDFs the eval
writes; within a JPEG codec's error for Pillow's PDFs)."""

from __future__ import annotations

import base64
import io

import pytest
import torch
from PIL import Image

from longmoe.data.images import decode_image, patchify
from longmoe.eval.extract.clients import EndpointExtractClient, chat_messages, pdf_bytes, pdf_page_image
from longmoe.pipelines.vision_extract.config import VisionExtractConfig
from longmoe.serve.api import create_app
from longmoe.serve.api.chat_files import attach_documents
from longmoe.serve.engine import Engine
from longmoe.serve.files.documents import parse
from longmoe.tasks.documents import held_out_seeds, render
from tests.helpers.models import tiny_model
from tests.helpers.server import serving

pytest.importorskip("pypdfium2")

RECIPE_VISION = VisionExtractConfig().vision_config()  # the page size the extraction model trains on
FAMILIES = ("form", "receipt", "table", "figure_page")
PAGES = [(f, s) for f in FAMILIES for s in held_out_seeds(2)]


def test_pdf_part_holds_the_page_and_renders_back_to_it():
    d = render("form_easy", 5)
    (msg,) = chat_messages(d, "pdf")
    part = next(p for p in msg["content"] if p["type"] == "file")["file"]
    head, b64 = part["file_data"].split(",", 1)
    assert head == "data:application/pdf;base64" and part["pages_as"] == "images"
    doc = parse(base64.b64decode(b64), "page.pdf", "application/pdf", pages_as="images")
    assert doc.kind == "pdf" and len(doc.pages) == 1 and list(doc.images) == [0]
    assert pdf_page_image(d.image).tobytes() == d.image.convert("RGB").tobytes()


def _doubled(page: Image.Image) -> Image.Image:
    """The page at twice its size (each pixel 2x2): a page larger than the model's page size."""
    return page.resize((page.width * 2, page.height * 2), Image.Resampling.NEAREST)


@pytest.mark.parametrize(("family", "seed"), PAGES)
@pytest.mark.parametrize("scale", ["as rendered", "doubled"])
def test_held_out_page_as_pdf_gives_the_image_paths_patches(family, seed, scale):
    page = render(family, seed).image
    page = _doubled(page) if scale == "doubled" else page
    via_pdf = patchify(pdf_page_image(page), RECIPE_VISION)
    direct = patchify(page, RECIPE_VISION)
    assert (via_pdf.rows, via_pdf.cols) == (direct.rows, direct.cols)
    assert torch.equal(via_pdf.pixels, direct.pixels)


@pytest.fixture(scope="module")
def recipe_vision_server(make_engine):
    """The app a server builds for a model with the recipe's vision config (its file path, unserved)."""
    return create_app(make_engine(tiny_model(vision=RECIPE_VISION)), model_name="v").state.server


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scale", ["as rendered", "doubled"])
def test_pdf_file_part_through_the_servers_file_path_reaches_the_model_as_the_images_patches(
    recipe_vision_server, family, scale
):
    page = render(family, held_out_seeds(1)[0]).image
    page = _doubled(page) if scale == "doubled" else page
    data = "data:application/pdf;base64," + base64.b64encode(pdf_bytes(page)).decode()
    part = {"type": "file", "file": {"file_data": data, "filename": "page.pdf", "pages_as": "images"}}
    (lead, _), _ = attach_documents(recipe_vision_server, "", [{"role": "user", "content": [part]}])
    (image_part,) = [p for p in lead["content"] if p["type"] == "image_url"]
    raw = base64.b64decode(image_part["image_url"]["url"].split(",", 1)[1])
    served, direct = patchify(decode_image(raw), RECIPE_VISION), patchify(page, RECIPE_VISION)
    assert torch.equal(served.pixels, direct.pixels)


def test_a_jpeg_scan_keeps_the_patch_grid_within_the_codecs_error():
    """Pillow writes a page image into a PDF as JPEG (quality 75): the same patches, each pixel
    within the codec's error (mean below 8/255), as a scanner's JPEG would give."""
    page = render("receipt", held_out_seeds(1)[0]).image
    buf = io.BytesIO()
    page.convert("RGB").save(buf, format="PDF")
    doc = parse(buf.getvalue(), "scan.pdf", "application/pdf", pages_as="images")
    back = Image.open(io.BytesIO(doc.images[0])).convert("RGB")
    a, b = patchify(back, RECIPE_VISION), patchify(page, RECIPE_VISION)
    assert (a.rows, a.cols) == (b.rows, b.cols)
    assert (a.pixels - b.pixels).abs().mean() < 8 / 255


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
