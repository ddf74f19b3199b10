"""Images in ``/v1/chat/completions`` over real HTTP (a tiny random vision model): content parts with
data URIs through the official client, streamed and whole, equal to the engine's own greedy output;
hostile images are 400s naming the part, and the server keeps serving; a text-only model refuses
images with a 400."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest

from longmoe.data.images import decode_image, patchify
from longmoe.eval.extract.clients import EndpointExtractClient
from longmoe.serve.sampling import SamplingParams
from longmoe.tasks.documents import held_out_seeds, render
from tests.helpers.models import VISION
from tests.helpers.server import served, wait_idle
from tests.serve.test_serve_images import encoded, png_bomb, uri

IMG = encoded("PNG", (24, 16), (10, 200, 40))  # 6 x 4 patches of 4 px
PART = "messages.0.content.1.image_url"


@pytest.fixture(scope="module")
def server(vision_dir):
    with served(
        vision_dir, prefill_chunk=8, max_images=2, max_image_bytes=20_000, max_image_pixels=1 << 20
    ) as (engine, _, url):
        yield engine, url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="x", max_retries=0, timeout=120)


def ask(*images: str | dict, text: str = "what is in the picture?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": im if isinstance(im, dict) else {"url": im}} for im in images]
    return [{"role": "user", "content": [{"type": "text", "text": text}, *parts]}]


def post(url: str, messages: list[dict], **kw) -> httpx.Response:
    body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0, **kw}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_chat_with_an_image_whole_and_streamed(server, client):
    engine, _ = server
    msgs = ask(uri(IMG))
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    patches = [patchify(decode_image(IMG), engine.model.cfg.vision)]
    assert (patches[0].rows, patches[0].cols) == (4, 6)
    ids = engine.encode_chat(msgs, images=patches)
    assert r.usage.prompt_tokens == len(ids) and ids.count(engine.tokenizer.image_patch_id) == 24
    want = engine.generate(ids, SamplingParams(max_tokens=12, temperature=0), images=patches)
    assert r.choices[0].message.content == want.text

    stream = client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=12, temperature=0, stream=True
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    assert text == want.text


def test_the_image_reaches_the_model(server):
    _, url = server
    a = post(url, ask(uri(IMG)), max_tokens=12).json()["choices"][0]["message"]["content"]
    other = encoded("PNG", (24, 16), (250, 250, 250))
    b = post(url, ask(uri(other)), max_tokens=12).json()["choices"][0]["message"]["content"]
    assert a != b


def test_image_url_as_a_plain_string_and_detail(server):
    _, url = server
    msgs = ask(uri(IMG))
    whole = post(url, msgs).json()
    msgs[0]["content"][1]["image_url"] = uri(IMG)
    assert post(url, msgs).json()["choices"] == whole["choices"]
    msgs[0]["content"][1]["image_url"] = {"url": uri(IMG), "detail": "low"}
    assert post(url, msgs).json()["choices"] == whole["choices"]


HOSTILE = {
    "truncated base64": (uri(IMG)[:-5], PART, "invalid base64"),
    "truncated image": (uri(IMG[: len(IMG) // 2 // 3 * 3]), PART, "truncated or corrupt"),
    "png bomb": (uri(png_bomb(3000)), PART, "3000x3000 = 9000000 pixels, more than the limit of 1048576"),
    "wrong mime": (uri(encoded("JPEG"), "image/png"), PART, "declared image/png but the data is a JPEG"),
    "not an image": (uri(b"<svg onload=alert(1)>"), PART, "not an image"),
    "svg media type": ("data:image/svg+xml;base64,PHN2Zz4=", PART, "unsupported media type"),
    "oversize": (uri(encoded("PNG", (200, 200)) + b"\0" * 30_000), PART, "exceeds the limit of 20000"),
    "remote url": ("https://example.com/cat.png", PART, "remote image URLs are not fetched"),
    "file url": ("file:///etc/passwd", PART, "expected a data URI"),
    "url not a string": ({"url": 5}, PART, ""),
    "unknown key": ({"url": uri(IMG), "x": 1}, PART, ""),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_images_are_400s_naming_the_part(server, name):
    engine, url = server
    image, param, what = HOSTILE[name]
    r = post(url, ask(image))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith(param) and what in err["message"], err
    assert post(url, ask(uri(IMG))).status_code == 200  # still serving
    assert wait_idle(engine)["running"] == 0


def test_too_many_images_and_images_outside_user_messages(server):
    _, url = server
    r = post(url, ask(uri(IMG), uri(IMG), uri(IMG)))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "3 images in the request, more than the limit of 2" in r.json()["error"]["message"]
    msgs = [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": uri(IMG)}}]}]
    r = post(url, msgs + [{"role": "user", "content": "hi"}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.0.content.0.image_url"


def test_text_that_spells_image_tokens_is_refused(server):
    """Typed image markers would shift which pixels land where (or ask decode for pixels): a 400."""
    _, url = server
    for text in ("<|image_patch|>", "<|image|><|/image|>"):
        r = post(url, ask(uri(IMG), text=text))
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    r = post(url, [{"role": "user", "content": "<|image|><|image_patch|><|/image|>"}])
    assert r.status_code == 400 and "no images were given" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages"
    assert post(url, [{"role": "user", "content": "<|image|><|/image|>"}]).status_code == 200  # no patches
    assert post(url, ask(uri(IMG))).status_code == 200


def test_a_text_only_model_refuses_images(model_dir):
    with served(model_dir) as (_, _, url):
        r = post(url, ask(uri(IMG)))
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == PART and "reads text only" in err["message"]
        assert post(url, [{"role": "user", "content": "hi"}]).status_code == 200


def test_data_uri_helper_round_trip():
    from longmoe.serve.images import to_data_uri

    assert to_data_uri(IMG) == uri(IMG) and base64.b64decode(to_data_uri(IMG).split(",")[1]) == IMG


def test_info_describes_the_vision_side(server):
    engine, url = server
    v = httpx.get(url + "/v1/info").json()["vision"]
    assert v == {"patch_size": 4, "max_image_side": 32, "max_images": 2, "max_image_bytes": 20_000}


def test_images_with_tools_and_response_format(server):
    """Images and the other chat features compose: a forced tool call and a JSON object answer."""
    engine, url = server
    # a bounded integer: digits are one token each, so a free "number" can outrun max_tokens
    amount = {"type": "integer", "minimum": 0, "maximum": 999}
    params = {"type": "object", "properties": {"amount": amount}, "required": ["amount"]}
    tools = [{"type": "function", "function": {"name": "total", "parameters": params}}]
    r = post(url, ask(uri(IMG)), tools=tools, tool_choice="required", max_tokens=60)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["name"] == "total"
    patches = [patchify(decode_image(IMG), engine.model.cfg.vision)]
    assert r.json()["usage"]["prompt_tokens"] == len(engine.encode_chat(ask(uri(IMG)), tools, patches))
    r = post(url, ask(uri(IMG)), response_format={"type": "json_object"}, max_tokens=200)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("{")


def test_extract_eval_client_reads_documents_through_this_server(server):
    """``longmoe eval --tasks extract --endpoint`` against longmoe's own server: the client's image
    parts are accepted, and the prompt the server counted holds the whole page's image span."""
    engine, url = server
    doc = render("form_easy", held_out_seeds(1)[0])
    client = EndpointExtractClient(url, "tiny")
    try:
        (reply,) = client.extract([doc], [8])
    finally:
        client.close()
    w, h = doc.image.size
    assert isinstance(reply.text, str) and reply.completion_tokens <= 8
    assert reply.prompt_tokens > VISION.image_tokens(h, w)
