"""The web page with documents, in real Chromium (Playwright, Debian's chromium as in
``test_serve_web_browser.py``): attach a PDF with the file button and see its name, pages and token
count; ask two questions and see the second answer's cached share (> 0%); drop a text file on the page
(a real ``drop`` event with a ``DataTransfer``) and see it uploaded; a refused file shows its reason."""

from __future__ import annotations

import re

import pytest

from longmoe.serve.api import create_app
from longmoe.serve.files.store import LocalStore
from tests.helpers.browser import chromium_page, until
from tests.helpers.documents import text_pdf
from tests.helpers.server import serving

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

KEY = "page-files-key"
BS = 16
ANSWER_DONE = "(n) => document.querySelectorAll('.note.cached').length >= n"


@pytest.fixture(scope="module")
def server(make_engine, tmp_path_factory):
    engine = make_engine(prefill_chunk=BS, prefix_block_size=BS)
    app = create_app(engine, model_name="tiny", api_key=KEY, files=LocalStore(tmp_path_factory.mktemp("f")))
    with serving(app) as url:
        yield url
    engine.close()


@pytest.fixture(scope="module")
def page():
    with chromium_page(900, 700) as pg:
        yield pg


def test_attach_pdf_ask_twice_and_see_the_cached_share(server, page, tmp_path):
    pdf = tmp_path / "mill report.pdf"
    pdf.write_bytes(text_pdf(["The mill's output rose by nine percent in the spring quarter.", "Page two."]))
    page.goto(server)
    page.fill("#key", KEY)
    page.dispatch_event("#key", "change")
    until(page, "() => !document.getElementById('attachdoc').disabled")
    page.fill("#maxtok", "3")
    page.set_input_files("#docfile", str(pdf))
    until(page, "() => document.querySelector('#docs .doc')?.dataset.fileId !== undefined")
    chip = page.inner_text("#docs .doc")
    assert re.fullmatch(r"mill report\.pdf · 2 pages · \d+ tokens", chip), chip
    page.fill("#msg", "How much did output rise?")
    page.press("#msg", "Enter")
    until(page, "() => document.querySelectorAll('.note.cached').length >= 1")
    first = page.locator(".note.cached").nth(0).inner_text()
    assert re.search(r"prompt \d+ tokens, 0 cached \(0%\)", first), first
    page.fill("#msg", "And in which quarter?")
    page.press("#msg", "Enter")
    until(page, "() => document.querySelectorAll('.note.cached').length >= 2")
    second = page.locator(".note.cached").nth(1).inner_text()
    m = re.search(r"prompt (\d+) tokens, (\d+) cached \((\d+)%\)", second)
    assert m and int(m.group(2)) > 0 and int(m.group(3)) > 50, second
    assert page.errors == []


@pytest.mark.slow(wall="not measured")
def test_drop_a_file_on_the_page_and_a_refused_one_says_why(server, page):
    page.goto(server)
    page.fill("#key", KEY)
    page.dispatch_event("#key", "change")
    until(page, "() => !document.getElementById('attachdoc').disabled")
    for name, data in (
        ("notes.md", "# Notes\\nthe east gate was repaired"),
        ("evil.zip", "PK\\u0003\\u0004xx"),
    ):
        dt = page.evaluate_handle(
            f"""() => {{ const d = new DataTransfer();
                d.items.add(new File(["{data}"], "{name}", {{ type: "text/plain" }})); return d; }}"""
        )
        page.dispatch_event("#app", "drop", {"dataTransfer": dt})
    chips_js = "[...document.querySelectorAll('#docs .doc')]"
    until(
        page, f"() => {chips_js}.length == 2 && !{chips_js}.some((c) => c.textContent.includes('uploading'))"
    )
    chips = page.locator("#docs .doc").all_inner_texts()
    assert re.fullmatch(r"notes\.md · 1 page · \d+ tokens", chips[0]), chips
    assert "zip archives are not accepted" in chips[1], chips
    assert page.locator("#docs .doc.err").count() == 1
