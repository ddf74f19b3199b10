"""``response_format`` over HTTP: ``json_object`` and ``json_schema`` in chat (OpenAI's field, through
the official client) and completions (a longmoe extension), streamed or whole; bad formats are 400s
naming ``response_format``."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.helpers.server import served
from tests.serve.test_serve_structured import NESTED, PERSON, validate

FMT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


@pytest.fixture(scope="module")
def server(model_dir):
    with served(model_dir, prefill_chunk=16) as (engine, app, url):
        yield app, url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="x", max_retries=0, timeout=120)


def test_chat_json_schema(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "who?"}], max_tokens=300, seed=seed,
            response_format=FMT,
        )  # fmt: skip
        assert r.choices[0].finish_reason == "stop"
        validate(json.loads(r.choices[0].message.content), PERSON)


def test_chat_json_object_streamed(client):
    chunks = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "{"}], max_tokens=400, seed=3, temperature=0.7,
        response_format={"type": "json_object"}, stream=True,
    )  # fmt: skip
    text, finish = "", None
    for ch in chunks:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: an incomplete document, as at OpenAI
        assert finish == "length" and text.startswith("{")


def test_completions_json_schema_extension(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": NESTED}}
    body = {"model": "tiny", "prompt": "x", "max_tokens": 400, "seed": 1, "response_format": fmt}
    r = httpx.post(server[1] + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop"
    validate(json.loads(c["text"]), NESTED)
    body["response_format"] = {"type": "text"}
    body["max_tokens"] = 4
    assert httpx.post(server[1] + "/v1/completions", json=body, timeout=60).status_code == 200


def test_completions_length_cut(server):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 3, "temperature": 0, "response_format": FMT}
    c = httpx.post(server[1] + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    assert c["finish_reason"] == "length" and c["text"] and '{"name": '.startswith(c["text"])


def test_grammar_cached_across_requests(server, client):
    app, _ = server
    for _ in range(2):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=2, response_format=FMT
        )
    g = app.state.server.grammars
    assert g is not None
    before = g.compiled
    client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "b"}], max_tokens=2, response_format=FMT
    )
    assert g.compiled == before


BAD = [
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 5}}},
    {"type": "json_schema"},
    {"type": "json_object", "json_schema": {"name": "x", "schema": {}}},
    {"type": "xml"},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}},
    "json",
]


@pytest.mark.parametrize("fmt", BAD, ids=range(len(BAD)))
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_response_format_is_400(server, path, fmt):
    body = {"model": "tiny", "max_tokens": 4, "response_format": fmt}
    body |= {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(server[1] + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"].startswith("response_format"), err
    assert "response_format" in err["message"]
