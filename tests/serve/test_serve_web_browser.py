"""The web chat page in a real browser (Playwright driving Debian's chromium, never a downloaded one):
type a message and watch it stream, stop it (the engine records the cancellation), send a second
turn, see an error rendered; the input stays in view, the log follows the text, code blocks render
as text; with a tiny vision model, attach images, remove one, send and see the request succeed.
``LONGMOE_SCREENSHOT=path.png`` also saves a screenshot of the page at the end."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
import torch

from longmoe.data.images import decode_image, patchify
from longmoe.serve.api import create_app
from longmoe.serve.engine import Engine
from tests.helpers.browser import chromium_page, until, wait_until
from tests.helpers.server import serving

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')"
)

KEY = "page-key"
STEP_DELAY_S = 0.02  # slows each forward so a stream lasts long enough to watch and stop


@pytest.fixture(scope="module")
def server(make_engine):
    engine = make_engine(prefill_chunk=64)
    tok = engine.tokenizer
    stops = [tok.eos_id, tok.end_id]

    def slow_and_endless(module, args, out):  # never ends on its own: only max_tokens or stop end it
        time.sleep(STEP_DELAY_S)
        out.logits[..., stops] = -torch.inf
        return out

    engine.model.register_forward_hook(slow_and_endless)
    app = create_app(engine, model_name="tiny <b>&", api_key=KEY)
    with serving(app) as url:
        yield engine, url
    engine.close()


@pytest.fixture(scope="module")
def page():
    with chromium_page(900, 640) as pg:
        # a refused script or style (CSP) is a console error; the 401/400 the test provokes are not
        pg.on(
            "console",
            lambda m: (
                pg.errors.append(m.text)
                if m.type == "error" and not m.text.startswith("Failed to load resource")
                else None
            ),
        )
        yield pg


LOG = "const l = document.getElementById('log');"
LOG_OVERFLOWS = f"() => {{ {LOG} return l.scrollHeight > l.clientHeight + 50; }}"
AT_BOTTOM = f"() => {{ {LOG} return l.scrollHeight - l.scrollTop - l.clientHeight < 80; }}"
REPLY_LONGER_THAN_40 = "() => (document.querySelector('.assistant')?.textContent.length || 0) > 40"
PROBE = """() => {
  const d = document.createElement('div'); d.id = 'probe'; document.getElementById('log').appendChild(d);
  render(d, 'see <b>x</b> `y<i>`:\\n```python\\ndef f():\\n' +
            '    return "<script>alert(1)</script>"\\n```\\nok');
}"""


def test_chat_session(server, page):
    engine, url = server
    page.goto(url)
    assert "tiny <b>&" in page.inner_text("h2")  # the model name as text, not markup
    assert page.locator("h2 b").count() == 0
    assert "model and cache status need the API key" in page.inner_text("#info")
    page.fill("#key", KEY)
    page.dispatch_event("#key", "change")
    until(page, "() => document.getElementById('info').textContent.includes('parameters')")
    assert "cache" in page.inner_text("#info") and "context 1024" in page.inner_text("#info")
    assert page.is_disabled("#attach")  # a text-only model: no image button

    # 1. type a message, see it stream with send disabled and stop enabled
    page.fill("#maxtok", "900")
    page.fill("#msg", "hello there")
    page.press("#msg", "Enter")
    reply = page.locator(".assistant").nth(0)
    until(page, REPLY_LONGER_THAN_40)
    assert page.is_disabled("#send") and page.is_enabled("#stop")
    n1 = len(reply.text_content())
    page.wait_for_timeout(400)
    assert len(reply.text_content()) > n1  # still streaming
    assert page.locator(".user").nth(0).text_content() == "hello there"

    # the log follows the text and the input stays in view
    until(page, LOG_OVERFLOWS)
    assert page.evaluate(AT_BOTTOM)
    box = page.locator("#msg").bounding_box()
    assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 640

    # 2. stop it: the fetch is aborted, the server cancels the request in the engine
    before = engine.stats()["finished_cancelled"]
    page.click("#stop")
    until(page, "() => document.querySelector('.assistant .note') !== null")
    assert "[stopped]" in reply.text_content()
    assert page.is_enabled("#send") and page.is_disabled("#stop")
    wait_until(lambda: engine.stats()["finished_cancelled"] == before + 1 and engine.stats()["running"] == 0)
    assert engine.stats()["cache_bytes_reserved"] == 0

    # 3. a second turn (the stopped reply stays in the history), streamed to its end
    page.fill("#maxtok", "12")
    page.fill("#msg", "and again")
    page.click("#send")
    until(page, "() => document.querySelectorAll('.assistant').length === 2")
    until(page, "() => !document.getElementById('send').disabled")
    second = page.locator(".assistant").nth(1)
    assert "[cut at max tokens]" in second.text_content()
    # the last prompt's size and cached share, from the stream's final usage chunk
    assert re.fullmatch(r"prompt \d+ tokens, \d+ cached \(\d+%\)", page.inner_text("#usage"))
    assert page.locator(".user").count() == 2
    assert page.evaluate(AT_BOTTOM)

    # 4. an error from the server is rendered, and the page still works after it
    page.fill("#maxtok", "0")
    page.fill("#msg", "bad request")
    page.click("#send")
    page.wait_for_selector(".err")
    err = page.inner_text(".err")
    assert "error 400" in err and "max_tokens" in err
    assert page.is_enabled("#send")
    assert engine.stats()["running"] == 0

    # code blocks render as text in <pre>, nothing the model writes becomes markup
    page.evaluate(PROBE)
    assert page.inner_text("#probe pre.code code") == 'def f():\n    return "<script>alert(1)</script>"'
    assert page.inner_text("#probe pre.code .lang") == "python"
    assert page.inner_text("#probe code.inline") == "y<i>"
    assert page.locator("#probe b, #probe i, #probe script").count() == 0
    page.evaluate("() => document.getElementById('probe').remove()")
    assert not page.errors, page.errors  # no script errors (a CSP violation would be one)

    if shot := os.environ.get("LONGMOE_SCREENSHOT"):
        page.screenshot(path=shot)


@pytest.fixture(scope="module")
def vision_server(vision_dir):
    engine = Engine.from_dir(vision_dir, prefill_chunk=16, max_image_bytes=20_000)
    app = create_app(engine, model_name="tiny-vision")
    with serving(app) as url:
        yield engine, url
    engine.close()


THUMB_LOADED = (
    "(sel) => { const i = document.querySelector(sel); return !!i && i.complete && i.naturalWidth > 0; }"
)


def test_attach_an_image(vision_server, page, tmp_path):
    """Pick two files, remove one before sending, send: the request (an image content part with a
    data URI) succeeds, the transcript shows the thumbnail, the CSP lets data: images load."""
    from PIL import Image

    engine, url = vision_server
    red, blue = tmp_path / "red.png", tmp_path / "blue.png"
    Image.new("RGB", (24, 16), (220, 20, 20)).save(red)
    Image.new("RGB", (16, 16), (20, 20, 220)).save(blue)
    page.goto(url)
    until(page, "() => document.getElementById('info').textContent.includes('parameters')")
    assert page.is_enabled("#attach")
    page.fill("#maxtok", "6")
    page.set_input_files("#file", [str(red), str(blue)])
    page.wait_for_selector("#attached img >> nth=1")
    assert page.evaluate(THUMB_LOADED, "#attached img")  # a data: thumbnail is allowed by the CSP
    page.click("#attached button[title='remove blue.png']")
    assert page.locator("#attached img").count() == 1
    assert page.get_attribute("#attached img", "alt") == "red.png"
    noise = tmp_path / "noise.png"  # ~49 KB of random pixels: over the server's 20 000-byte limit
    Image.frombytes("RGB", (128, 128), os.urandom(128 * 128 * 3)).save(noise)
    page.set_input_files("#file", str(noise))
    page.wait_for_selector(".err")
    assert "noise.png" in page.inner_text(".err") and "19.5 KiB" in page.inner_text(".err")
    assert page.locator("#attached img").count() == 1  # not attached

    before = engine.stats()["prompt_tokens"]
    with page.expect_response("**/v1/chat/completions") as resp:
        page.fill("#msg", "what colour?")
        page.press("#msg", "Enter")
    assert resp.value.status == 200
    until(page, "() => !document.getElementById('send').disabled")
    user = page.locator(".user").last
    assert user.locator("img").count() == 1 and "what colour?" in user.text_content()
    assert page.evaluate(THUMB_LOADED, ".user img")
    assert page.locator("#attached img").count() == 0  # sent: the attachment row is empty
    assert page.locator(".err").count() == 1  # only the refused file's note
    body = json.loads(resp.value.request.post_data)
    parts = body["messages"][-1]["content"]
    assert [p["type"] for p in parts] == ["image_url", "text"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    # exactly the red image (6x4 patches) went into the prompt
    patches = [patchify(decode_image(red.read_bytes()), engine.model.cfg.vision)]
    assert engine.stats()["prompt_tokens"] - before == len(
        engine.encode_chat(body["messages"], images=patches)
    )

    # a second turn without an image keeps the first image in the history
    page.fill("#msg", "and now?")
    page.press("#msg", "Enter")
    until(page, "() => document.querySelectorAll('.assistant').length === 2")
    until(page, "() => !document.getElementById('send').disabled")
    assert page.locator(".err").count() == 1  # only the refused file's note
    assert not page.errors, page.errors
