"""HTTP server: the official ``openai`` client against a loopback server started here; a table of
malformed requests with their status and message; disconnect frees the cache; API key enforced."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from longmoe.serve.api import create_app
from longmoe.serve.sampling import SamplingParams
from tests.helpers.models import MAX_CONTEXT
from tests.helpers.prom import scrape, value
from tests.helpers.server import serving

KEY = "test-key"
MAX_BODY = 64 * 1024
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(make_engine):
    engine = make_engine(prefill_chunk=16)
    app = create_app(engine, model_name="tiny", api_key=KEY, max_body_bytes=MAX_BODY)
    with serving(app) as url:
        yield engine, url
    engine.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_completion_matches_engine(server, client):
    engine, _ = server
    r = client.completions.create(model="tiny", prompt="def foo(x):", max_tokens=8, temperature=0, logprobs=2)
    ref = engine.generate("def foo(x):", SamplingParams(max_tokens=8, temperature=0.0))
    ch = r.choices[0]
    assert ch.text == ref.text
    assert ch.finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == ref.prompt_tokens
    assert r.usage.completion_tokens == ref.completion_tokens
    assert r.usage.total_tokens == ref.prompt_tokens + ref.completion_tokens
    assert len(ch.logprobs.token_logprobs) == ref.completion_tokens
    seeded = dict(model="tiny", prompt="x", max_tokens=8, temperature=1.0, seed=5)
    a, b = (client.completions.create(**seeded).choices[0].text for _ in range(2))
    assert a == b


def test_chat_and_streaming_agree(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    assert full.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == full.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_completion_stream_sse_format(server):
    _, url = server
    body = {"model": "tiny", "prompt": "import", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
COMP = {"model": "tiny", "prompt": "hi"}
C, CH = "/v1/completions", "/v1/chat/completions"
M0 = "messages.0"
CTX = MAX_CONTEXT
BAD = [
    # (id, path, body (bytes = raw), status, message regex, param)
    ("invalid-json", C, b'{"model": "tiny",', 400, "invalid JSON body", None),
    ("not-an-object", C, b"[1, 2]", 400, "expected a JSON object", None),
    ("missing-prompt", C, {"model": "tiny"}, 400, "prompt: Field required", "prompt"),
    ("prompt-wrong-type", C, {**COMP, "prompt": 5}, 400, "prompt: invalid value", "prompt"),
    ("max-tokens-string", C, {**COMP, "max_tokens": "5"}, 400, "max_tokens: .*integer", "max_tokens"),
    ("temperature-string", CH, {**CHAT, "temperature": "hot"}, 400, "temperature:", "temperature"),
    ("stream-string", C, {**COMP, "stream": "yes"}, 400, "stream: .*boolean", "stream"),
    ("unknown-model", C, {**COMP, "model": "gpt-9"}, 404, "model 'gpt-9' does not exist", "model"),
    ("unknown-model-chat", CH, {**CHAT, "model": "x"}, 404, "does not exist", "model"),
    ("empty-messages", CH, {**CHAT, "messages": []}, 400, "messages: .*at least 1", "messages"),
    ("bad-role", CH, {**CHAT, "messages": [{"role": "bot", "content": "x"}]}, 400, f"{M0}.role",
     f"{M0}.role"),
    ("content-int", CH, {**CHAT, "messages": [{"role": "user", "content": 3}]}, 400, f"{M0}.content",
     f"{M0}.content"),
    ("max-tokens-zero", C, {**COMP, "max_tokens": 0}, 400, "max_tokens: expected an integer >= 1",
     "max_tokens"),
    ("max-tokens-negative-chat", CH, {**CHAT, "max_tokens": -3}, 400, "max_tokens:", "max_tokens"),
    ("max-tokens-beyond-context", C, {**COMP, "max_tokens": CTX}, 400,
     "max_tokens: .* exceeds the context window", "max_tokens"),
    ("prompt-too-long", C, {**COMP, "prompt": [20] * (CTX + 5)}, 400,
     f"prompt: has {CTX + 5} tokens but the context window is {CTX}", "prompt"),
    ("token-id-out-of-vocab", C, {**COMP, "prompt": [1, 10**6]}, 400, "token ids must be in", "prompt"),
    ("unknown-field", C, {**COMP, "foo": 1}, 400, "unknown field 'foo'", "foo"),
    ("unknown-field-message", CH, {**CHAT, "messages": [{"role": "user", "content": "x", "mood": 1}]}, 400,
     f"unknown field '{M0}.mood'", f"{M0}.mood"),
    ("top-p-range", C, {**COMP, "top_p": 2.0}, 400, r"top_p: expected a number in \[0.0, 1.0\]", "top_p"),
    ("n-two", C, {**COMP, "n": 2}, 400, "n: only n=1", "n"),
    ("stop-empty", C, {**COMP, "stop": [""]}, 400, "stop: expected non-empty", "stop"),
    ("huge-body", C, b'{"model": "tiny", "prompt": "' + b"a" * (2 * MAX_BODY) + b'"}', 413,
     "exceeds the limit", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "status", "message", "param"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_malformed_requests(server, path, body, status, message, param):
    _, url = server
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(url + path, headers={**AUTH, "Content-Type": "application/json"}, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert re.search(message, err["message"]), err["message"]
    assert err["param"] == param


def test_server_survives_and_routes(server):
    _, url = server
    assert httpx.get(url + "/nope").status_code == 404
    assert "error" in httpx.get(url + "/nope").json()
    assert httpx.get(url + "/v1/completions", headers=AUTH).status_code == 405
    h = httpx.get(url + "/health").json()
    assert h["status"] == "ok"
    page = httpx.get(url + "/")
    assert page.status_code == 200
    assert "/v1/chat/completions" in page.text
    assert httpx.get(url + "/metrics").status_code == 401  # behind the key when one is set
    m = scrape(url, AUTH)
    for name in ("longmoe_cache_bytes_in_use", "longmoe_queue_depth", "longmoe_tokens_per_second"):
        assert value(m, name) >= 0
    assert value(m, "longmoe_http_requests_total", route="/v1/completions", status="400") >= 1


def test_disconnect_frees_cache(server):
    engine, url = server
    before = engine.stats()["finished_cancelled"]
    body = {"model": "tiny", "prompt": "x", "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
        assert engine.stats()["running"] == 1
        assert engine.stats()["cache_bytes_in_use"] > 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        s = engine.stats()
        if s["running"] == 0 and s["cache_bytes_in_use"] == 0 and s["finished_cancelled"] > before:
            break
        time.sleep(0.05)
    s = engine.stats()
    assert (s["running"], s["cache_bytes_in_use"], s["cache_bytes_reserved"]) == (0, 0, 0)
    assert s["finished_cancelled"] == before + 1
    assert s["generated_tokens"] < 900 + 200  # it stopped long before max_tokens


def test_api_key_enforced(server):
    _, url = server
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny", prompt="x", max_tokens=2)
    for path in ("/v1/models", "/v1/completions", "/v1/chat/completions"):
        r = httpx.request("GET" if path == "/v1/models" else "POST", url + path, json=COMP)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(url + "/health").status_code == 200


def test_info_route_behind_key(server):
    engine, url = server
    assert httpx.get(url + "/v1/info").status_code == 401
    r = httpx.get(url + "/v1/info", headers=AUTH)
    assert r.status_code == 200
    s = r.json()
    assert s["model"] == "tiny" and s["max_context"] == engine.max_context
    assert s["parameters"] == sum(p.numel() for p in engine.model.parameters())
    assert s["layers"] == engine.model.cfg.n_layers and s["cache_budget_bytes"] == engine.budget.budget
    assert s["vision"] is None  # a text-only model: the page disables its image button
    for k in ("running", "waiting", "cache_bytes_in_use", "cache_bytes_reserved", "tokens_per_second"):
        assert isinstance(s[k], int | float)
