"""Fuzz: 240 hostile requests from a seeded generator (methods, paths, headers, bodies) against every
route of a server with a key. No response is a 5xx, every error is OpenAI's error object, the
connection is never dropped without ``Connection: close`` (one keep-alive client sends them all),
nothing is logged at ERROR, and a good request succeeds after each batch of 20."""

from __future__ import annotations

import json
import logging
import random
import time

import httpx
import pytest

from longmoe.serve.api import create_app
from tests.helpers.server import port_of, serving

SEED = 19
N_REQUESTS = 240
BATCH = 20
KEY = "fuzz-key"
MAX_BODY = 64 * 1024

ROUTES = [
    ("GET", "/"),
    ("GET", "/health"),
    ("GET", "/ready"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/tiny"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
]
BASE = {
    "/v1/completions": {"model": "tiny", "prompt": "hello", "max_tokens": 2},
    "/v1/chat/completions": {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    },
}
SURROGATE = "\ud800"  # json.dumps writes it as the escape "\ud800": a lone surrogate on the wire


def hostile_values(rng: random.Random) -> list[object]:
    depth = rng.choice([33, 200, 3000])
    return [
        None, True, False, 0, -1, 1.5, -1e308, 2**63, 10**25, "", "5", "x" * rng.randint(1, 5000),
        SURROGATE, "a" + SURROGATE + "b", "\udfff", "</script><script>alert(1)</script>", "\x00\x01\x7f",
        [], [1, "a", None], [SURROGATE], {}, {"a": {"b": [SURROGATE]}}, [[[[[[]]]]]],
        json.loads("[" * min(depth, 900) + "]" * min(depth, 900)), ["a"] * rng.randint(5, 400),
        [rng.randint(-10, 10**7) for _ in range(rng.randint(1, 50))],
    ]  # fmt: skip


RAW_BODIES = [
    b"",
    b"{",
    b"null",
    b"[]",
    b'"str"',
    b"\xff\xfe\xfd",
    b"\xef\xbb\xbf{}",
    b'{"model": "tiny", "prompt": 1e99999}',
    b'{"model": "tiny", "prompt": "x", "max_tokens": NaN}',
    b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * 4500 + b"}",
    b'{"model": "tiny", "prompt": "\\ud800\\udc00\\ud800"}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udfff"}]}',
    b'{"model": "tiny", "prompt": "x", "stop": ["\\ud83d"]}',
    b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"a": ' * 2000 + b"1" + b"}" * 2000,
    b'{"model": "tiny", "prompt": "x"' + b", " * 30_000 + b"}",
    b'{"model": "tiny", "prompt": "x", "model": "tiny", "model": "other"}',
    b"\x00" * 100,
    b"x" * (MAX_BODY + 1),
]
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/plain", "",
                 "application/x-www-form-urlencoded", "multipart/form-data; boundary=zz",
                 "application/json\x7f", "*/*"]  # fmt: skip
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "top_k", "n", "stream", "stream_options", "stop", "stop_token_ids", "seed", "logprobs",
          "top_logprobs", "frequency_penalty", "presence_penalty", "repetition_penalty", "ignore_eos",
          "user", "echo", "extra_field", SURROGATE]  # fmt: skip


def mutate_body(rng: random.Random, path: str) -> dict:
    body = json.loads(json.dumps(BASE[path]))
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.7:
            body[rng.choice(FIELDS)] = rng.choice(hostile_values(rng))
        elif kind < 0.85 and "messages" in body and isinstance(body["messages"], list) and body["messages"]:
            msg = body["messages"][0] if isinstance(body["messages"][0], dict) else {}
            msg[rng.choice(["role", "content", "name", "tool_calls", "mood"])] = rng.choice(
                hostile_values(rng)
            )
            body["messages"][0] = msg
        else:
            body.pop(rng.choice(list(body) or ["model"]), None)
    return body


def hostile_request(rng: random.Random, port: int) -> tuple[str, str, dict[str, str], bytes]:
    """(method, path, headers, body) of one generated request."""
    method, path = rng.choice(ROUTES[5:] if rng.random() < 0.65 else ROUTES[:5])  # mostly the POST routes
    r = rng.random()
    if r < 0.08:
        method = rng.choice(
            ["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "GET" if method == "POST" else "POST"]
        )
    elif r < 0.16:
        path = rng.choice([
            "/v1/models/" + "m" * rng.randint(1, 5000), "/v1/models/%ED%A0%80", "/nope", "/v1/../v1/models",
            "/" + "a" * rng.randint(100, 6000), "/v1/completions/extra", "//v1//models", "/%00",
            "/v1/models/%2F..",
        ])  # fmt: skip
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    r = rng.random()
    if r < 0.1:
        headers.pop("Authorization")
    elif r < 0.15:
        headers["Authorization"] = rng.choice(
            ["Bearer wrong", "Basic abc", "Bearer", "bearer " + KEY, "x" * 4000]
        )
    if rng.random() < 0.12:
        headers["Content-Type"] = rng.choice(CONTENT_TYPES)
    if rng.random() < 0.08:
        headers["Host"] = rng.choice(
            ["evil.example", f"localhost:{port}", "", "127.0.0.1.evil.example", "[::1]"]
        )
    if rng.random() < 0.05:
        name = rng.choice(["X-Forwarded-For", "Origin", "Transfer-Encoding-X", "Accept", "X-Request-Id"])
        headers[name] = "x" * rng.randint(0, 2000)
    body = b""
    if method in ("POST", "PUT", "PATCH"):
        if rng.random() < 0.3 or path not in BASE:
            body = rng.choice(RAW_BODIES)
        else:
            body = json.dumps(mutate_body(rng, path) if path in BASE else {}).encode()
    return method, path, headers, body


@pytest.fixture(scope="module")
def server(make_engine):
    with make_engine(max_context=64) as engine:  # every generation stays short
        app = create_app(engine, model_name="tiny", api_key=KEY, max_body_bytes=MAX_BODY, body_timeout_s=5)
        with serving(app) as url:
            yield engine, port_of(url)


def test_fuzz_hostile_requests(server, caplog):
    engine, port = server
    rng = random.Random(SEED)
    url = f"http://127.0.0.1:{port}"
    statuses: dict[int, int] = {}
    routes_hit = set()
    uvicorn_log = logging.getLogger("uvicorn.error")  # does not propagate: watch it directly
    uvicorn_log.addHandler(caplog.handler)
    with caplog.at_level(logging.WARNING), httpx.Client(base_url=url, timeout=60) as client:
        for i in range(N_REQUESTS):
            method, path, headers, body = hostile_request(rng, port)
            routes_hit.add(path if (method, path) in ROUTES else "other")
            r = client.request(method, path, headers=headers, content=body)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            what = f"#{i} {method} {path[:60]} {body[:80]!r} -> {r.status_code} {r.text[:300]}"
            assert r.status_code < 500, what
            if r.status_code >= 400 and method != "HEAD":
                err = r.json()["error"]
                assert set(err) == {"message", "type", "param", "code"}, what
                assert isinstance(err["message"], str) and len(err["message"]) < 600, what
            if (i + 1) % BATCH == 0:  # the server still serves a good request after each batch
                good = client.post(
                    "/v1/chat/completions",
                    json=BASE["/v1/chat/completions"],
                    headers={"Authorization": f"Bearer {KEY}"},
                )
                assert good.status_code == 200, good.text
                assert good.json()["choices"][0]["message"]["role"] == "assistant"
    assert not [x for x in caplog.records if x.levelno >= logging.ERROR], (
        "a hostile request was logged as a crash"
    )
    assert routes_hit >= {p for _, p in ROUTES} | {"other"}  # every endpoint was fuzzed
    assert sum(n for s, n in statuses.items() if s >= 400) >= N_REQUESTS // 2  # mostly hostile
    # A request whose client went away leaves the engine at its next scheduler step, which a loaded
    # machine may not have run yet: wait for the drain (a leaked request never drains).
    deadline = time.monotonic() + 30
    while (s := engine.stats())["running"] + s["waiting"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (s["running"], s["waiting"]) == (0, 0)
