"""The server under hostile input, slow clients and untrusted pages (issue 19), one table per class:
malformed bodies (deep nesting, huge integers, lone surrogates, non-finite numbers, wrong types)
get a 4xx naming the field and no traceback; stop caps; validation gaps; Host, media-type, CORS and
/metrics rules; the page escapes the model name; body timeout, connection cap, per-client cap;
tokenising off the event loop; a non-streamed request is cancelled when its client leaves."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time

import httpx
import openai
import pytest
from starlette.testclient import TestClient

from longmoe.serve.api import create_app, serve_in_thread
from longmoe.serve.api.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS
from longmoe.serve.api.web import script_literal
from tests.helpers.server import port_of, serving

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
C, CH = "/v1/completions", "/v1/chat/completions"
COMP = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


@pytest.fixture
def slow_engine(make_engine):
    """An engine whose every forward takes 5 ms more: long requests stay in flight for seconds."""
    with make_engine() as e:
        fwd = e.model.forward

        def slow(*a, **kw):
            time.sleep(0.005)
            return fwd(*a, **kw)

        e.model.forward = slow
        yield e


@pytest.fixture(scope="module")
def server(engine):
    app = create_app(engine, model_name="tiny", api_key=KEY, max_body_bytes=256 * 1024, body_timeout_s=1.0)
    with serving(app) as url:
        yield url, port_of(url)


def assert_error_shape(r: httpx.Response, status: int, param: str | None = None, message: str = "") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, err
    assert re.search(message, err["message"]), err["message"]
    return err


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def body_with(path: str, field: str, raw_value: str) -> bytes:
    """A valid body for ``path`` with ``field`` replaced by the raw JSON text ``raw_value``."""
    base = dict(COMP if path == C else CHAT)
    base[field] = "@@"
    return json.dumps(base).replace('"@@"', raw_value).encode()


SURR = '"\\ud800"'  # a lone high surrogate, written as a JSON escape
MALFORMED = [
    # (id, path, raw body, param, message regex)
    ("deep-array-prompt", C, body_with(C, "prompt", nested(50_000)), "prompt", "nested deeper"),
    ("deep-array-shallow", C, body_with(C, "prompt", nested(40)), "prompt", "nested deeper than 32"),
    ("deep-object", CH, body_with(CH, "messages", '[{"role": "user", "content": "x", "tool_calls": [' +
     '{"a":' * 40 + "1" + "}" * 40 + "]}]"), "messages", "nested deeper"),
    ("deep-body", C, nested(5000).encode(), None, "nested deeper"),
    ("huge-int-max-tokens", C, body_with(C, "max_tokens", "9" * 5000), "max_tokens", "5000 digits"),
    ("huge-int-seed", CH, body_with(CH, "seed", "-" + "1" * 3000), "seed", "3000 digits"),
    ("huge-int-in-prompt", C, body_with(C, "prompt", "[1, " + "7" * 4400 + "]"), "prompt.1", "4400 digits"),
    ("huge-int-top-k", CH, body_with(CH, "top_k", "1" * 21), "top_k", "21 digits"),
    ("huge-float-temperature", C, body_with(C, "temperature", "1e999"), "temperature", "finite"),
    ("nan-top-p", C, body_with(C, "top_p", "NaN"), "top_p", "finite"),
    ("infinity-penalty", CH, body_with(CH, "presence_penalty", "-Infinity"), "presence_penalty", "finite"),
    ("surrogate-prompt", C, body_with(C, "prompt", SURR), "prompt", "surrogate"),
    ("surrogate-prompt-list", C, body_with(C, "prompt", "[" + SURR + "]"), "prompt.0", "surrogate"),
    ("surrogate-content", CH, body_with(CH, "messages", '[{"role": "user", "content": ' + SURR + "}]"),
     "messages.0.content", "surrogate"),
    ("surrogate-content-part", CH, body_with(CH, "messages",
     '[{"role": "user", "content": [{"type": "text", "text": "a\\udc00b"}]}]'),
     "messages.0.content.0.text", "surrogate"),
    ("surrogate-model", C, body_with(C, "model", SURR), "model", "surrogate"),
    ("surrogate-stop", CH, body_with(CH, "stop", SURR), "stop", "surrogate"),
    ("surrogate-stop-list", C, body_with(C, "stop", '["ok", ' + SURR + "]"), "stop.1", "surrogate"),
    ("surrogate-user", C, body_with(C, "user", SURR), "user", "surrogate"),
    ("surrogate-key", C, b'{"model": "tiny", "prompt": "x", "\\ud800": 1}', None, "key contains a lone"),
    ("invalid-utf8", C, b'{"model": "tiny", "prompt": "\xff\xfe"}', None, "invalid JSON"),
    ("utf16-body", C, json.dumps(COMP).encode("utf-16"), None, None),  # decodes: accepted (200)
    ("truncated", CH, b'{"model": "tiny", "messages": [', None, "invalid JSON"),
    ("empty", C, b"", None, "invalid JSON"),
    ("bare-string", C, b'"hello"', None, "expected a JSON object"),
    ("null", CH, b"null", None, "expected a JSON object"),
    ("messages-object", CH, body_with(CH, "messages", '{"role": "user"}'), "messages", ""),
    ("prompt-object", C, body_with(C, "prompt", '{"a": 1}'), "prompt", ""),
    ("stop-int", C, body_with(C, "stop", "5"), "stop", ""),
    ("stream-options-list", CH, body_with(CH, "stream_options", "[]"), "stream_options", ""),
    ("temperature-bool", C, body_with(C, "temperature", "true"), "temperature", ""),
    ("max-tokens-float", C, body_with(C, "max_tokens", "2.5"), "max_tokens", ""),
    ("model-list", CH, body_with(CH, "model", '["tiny"]'), "model", ""),
    ("role-int", CH, body_with(CH, "messages", '[{"role": 1, "content": "x"}]'), "messages.0.role", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "param", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_bodies_get_4xx_naming_the_field(server, caplog, path, body, param, message):
    url, _ = server
    with caplog.at_level(logging.WARNING):
        r = httpx.post(url + path, content=body, headers=AUTH, timeout=30)
    if message is None:
        assert r.status_code == 200, r.text
        return
    assert_error_shape(r, 400, param, message)
    assert "connection" not in r.headers  # the body was read: the connection stays usable
    assert not [x for x in caplog.records if x.levelno >= logging.ERROR], "no traceback for a bad request"


STOPS = [
    # (id, stop, status)
    ("max-count", ["a"] * MAX_STOP_STRINGS, 200),
    ("max-length", ["x" * MAX_STOP_CHARS], 200),
    ("too-many", ["a"] * (MAX_STOP_STRINGS + 1), 400),
    ("too-long", ["x" * (MAX_STOP_CHARS + 1)], 400),
    ("too-long-single-string", "y" * (MAX_STOP_CHARS + 1), 400),
    ("hundreds", [str(i) for i in range(300)], 400),
]


@pytest.mark.parametrize("path", [C, CH])
@pytest.mark.parametrize(("stop", "status"), [s[1:] for s in STOPS], ids=[s[0] for s in STOPS])
def test_stop_strings_capped(server, path, stop, status):
    url, _ = server
    r = httpx.post(url + path, json={**(COMP if path == C else CHAT), "stop": stop}, headers=AUTH, timeout=30)
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        assert_error_shape(r, 400, "stop", r"stop: at most|stop: each stop string")


VALIDATION = [
    # (id, path, body, status, param, message)
    ("chat-max-tokens-0", CH, {**CHAT, "max_tokens": 0}, 400, "max_tokens",
     "expected an integer >= 1, got 0"),
    ("chat-max-completion-tokens-0", CH, {**CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens",
     "max_completion_tokens: expected an integer >= 1"),
    ("chat-max-completion-wins", CH, {**CHAT, "max_tokens": 3, "max_completion_tokens": -1}, 400,
     "max_completion_tokens", ""),
    ("chat-max-completion-over-context", CH, {**CHAT, "max_completion_tokens": 10**6}, 400,
     "max_completion_tokens", "max_completion_tokens: .* exceeds the context window"),
    ("completion-max-tokens-0", C, {**COMP, "max_tokens": 0}, 400, "max_tokens", ">= 1"),
    ("temperature-above-2", C, {**COMP, "temperature": 2.01}, 400, "temperature", "less than or equal to 2"),
    ("temperature-above-2-chat", CH, {**CHAT, "temperature": 50}, 400, "temperature", "less than or equal"),
    ("temperature-negative", CH, {**CHAT, "temperature": -0.1}, 400, "temperature", "greater than or equal"),
    ("temperature-2-ok", C, {**COMP, "temperature": 2.0}, 200, None, ""),
    ("temperature-0-ok", CH, {**CHAT, "temperature": 0}, 200, None, ""),
    ("long-model-name-not-echoed", C, {**COMP, "model": "m" * 100_000}, 404, "model", r"^.{0,200}$"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "message"),
    [v[1:] for v in VALIDATION],
    ids=[v[0] for v in VALIDATION],
)
def test_validation_gaps(server, path, body, status, param, message):
    url, _ = server
    r = httpx.post(url + path, json=body, headers=AUTH, timeout=30)
    if status == 200:
        assert r.status_code == 200, r.text
        return
    assert_error_shape(r, status, param, message)


def test_chat_max_completion_tokens_honoured(server):
    url, _ = server
    body = {**CHAT, "max_completion_tokens": 3, "ignore_eos": True}
    r = httpx.post(url + CH, json=body, headers=AUTH, timeout=30).json()
    assert r["usage"]["completion_tokens"] == 3


def test_models_retrieve_and_unknown_paths(server):
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    m = client.models.retrieve("tiny")
    assert (m.id, m.object) == ("tiny", "model")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")
    assert httpx.get(url + "/v1/models/tiny").status_code == 401  # behind the key like /v1/models
    r = httpx.get(url + "/" + "a" * 5000)
    err = assert_error_shape(r, 404, None, "no route")
    assert len(err["message"]) < 200  # the path is not echoed in full


HOSTS = [
    # (id, Host header, status)
    ("loopback-v4", "127.0.0.1:{port}", 200),
    ("localhost", "localhost:{port}", 200),
    ("localhost-no-port", "localhost", 200),
    ("loopback-v6", "[::1]:{port}", 200),
    ("upper-case", "LOCALHOST:{port}", 200),
    ("rebinding-name", "attacker.example:{port}", 421),
    ("rebinding-no-port", "attacker.example", 421),
    ("suffix-trick", "localhost.attacker.example", 421),
    ("prefix-trick", "evil-127.0.0.1", 421),
    ("empty", "", 421),
]


@pytest.mark.parametrize(("host", "status"), [h[1:] for h in HOSTS], ids=[h[0] for h in HOSTS])
@pytest.mark.parametrize(("method", "path"), [("GET", "/health"), ("GET", "/"), ("POST", C)])
def test_host_header_checked(server, host, status, method, path):
    url, port = server
    r = httpx.request(
        method, url + path, json=COMP, headers={**AUTH, "Host": host.format(port=port)}, timeout=30
    )
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        assert_error_shape(r, 421, None, "is not allowed")
        if method == "POST":
            assert r.headers["connection"] == "close"


CONTENT_TYPES = [
    # (id, Content-Type, status)
    ("json", "application/json", 200),
    ("json-charset", "application/json; charset=utf-8", 200),
    ("json-upper", "Application/JSON", 200),
    ("text-plain", "text/plain", 415),
    ("form", "application/x-www-form-urlencoded", 415),
    ("multipart", "multipart/form-data; boundary=x", 415),
    ("missing", None, 415),
    ("json-lookalike", "application/jsonx", 415),
]


@pytest.mark.parametrize(
    ("ctype", "status"), [c[1:] for c in CONTENT_TYPES], ids=[c[0] for c in CONTENT_TYPES]
)
@pytest.mark.parametrize("path", [C, CH])
def test_only_json_bodies(server, path, ctype, status):
    url, _ = server
    headers = {"Authorization": AUTH["Authorization"]} | ({"Content-Type": ctype} if ctype else {})
    body = json.dumps(COMP if path == C else CHAT).encode()
    r = httpx.post(url + path, content=body, headers=headers, timeout=30)
    if status == 200:
        assert r.status_code == 200, r.text
    else:
        assert_error_shape(r, 415, None, "Content-Type must be application/json")


def local_client(app) -> TestClient:
    return TestClient(app, base_url="http://localhost")


CORS = [
    # (id, configured origins, request Origin, allowed)
    ("off-by-default", (), "https://evil.example", False),
    ("off-even-for-self", (), "http://localhost", False),
    ("configured-match", ("https://app.example",), "https://app.example", True),
    ("configured-other", ("https://app.example",), "https://evil.example", False),
]


@pytest.mark.parametrize(("origins", "origin", "allowed"), [c[1:] for c in CORS], ids=[c[0] for c in CORS])
def test_cors_policy(engine, origins, origin, allowed):
    client = local_client(create_app(engine, model_name="tiny", cors_origins=origins))
    pre = client.options(
        C, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type"},
    )  # fmt: skip
    got = client.get("/health", headers={"Origin": origin})
    assert (pre.headers.get("access-control-allow-origin") == origin) is allowed
    assert (got.headers.get("access-control-allow-origin") == origin) is allowed


METRICS = [
    # (id, api key, metrics_public, send key, status)
    ("no-key-open", None, False, False, 200),
    ("key-required", KEY, False, False, 401),
    ("key-given", KEY, False, True, 200),
    ("public-option", KEY, True, False, 200),
]


@pytest.mark.parametrize(
    ("key", "public", "send", "status"), [m[1:] for m in METRICS], ids=[m[0] for m in METRICS]
)
def test_metrics_access(engine, key, public, send, status):
    client = local_client(create_app(engine, model_name="tiny", api_key=key, metrics_public=public))
    r = client.get("/metrics", headers={"Authorization": f"Bearer {KEY}"} if send else {})
    assert r.status_code == status
    if status == 200:
        assert "longmoe_queue_depth" in r.text


HOSTILE_NAMES = [
    "</script><script>alert(1)</script>",
    '"; alert(1); "',
    "<img src=x onerror=alert(1)>",
    "a&b'c\"d<e>f",
    "line\u2028sep</SCRIPT>",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_page_escapes_model_name(engine, name):
    r = local_client(create_app(engine, model_name=name)).get("/")
    assert r.status_code == 200
    page = r.text
    assert "<script>alert" not in page and "<img" not in page
    assert page.count("<script") == 1 and page.lower().count("</script>") == 1  # only the page's own
    nonce = re.search(r'<script nonce="([^"]+)">', page).group(1)
    assert f"script-src 'nonce-{nonce}'" in r.headers["content-security-policy"]
    assert f"const MODEL = {script_literal(name)};" in page
    assert json.loads(script_literal(name)) == name  # the script sees the exact name


def raw_request(port: int, head: str, body: bytes = b"", wait: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(head.encode() + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_slow_body_times_out_and_closes(server):
    _, port = server
    head = (f"POST {C} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")  # fmt: skip
    t0 = time.monotonic()
    out = raw_request(port, head, b'{"model": ')  # 10 of 100 bytes, then nothing
    assert time.monotonic() - t0 < 8
    status, rest = out.split(b"\r\n", 1)
    assert b" 408 " in status
    assert b"connection: close" in rest.lower()
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "body_timeout"


@pytest.mark.parametrize(
    ("declared", "sent"),
    [(10**9, 10), (300 * 1024, 300 * 1024), (None, 300 * 1024)],
    ids=["declared", "actual", "chunked"],
)
def test_body_size_checked_before_parsing_and_closes(server, declared, sent):
    _, port = server
    length = f"Content-Length: {declared}" if declared else "Transfer-Encoding: chunked"
    head = (f"POST {C} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\n{length}\r\n\r\n")  # fmt: skip
    body = b"[" * sent
    if declared is None:
        body = f"{sent:x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    try:
        out = raw_request(port, head, body)
    except ConnectionResetError:
        return  # the server answered and closed before we finished sending: also a refusal
    status, rest = out.split(b"\r\n", 1)
    assert b" 413 " in status
    assert b"connection: close" in rest.lower()


def test_connection_cap(engine):
    srv, th, port = serve_in_thread(create_app(engine, model_name="tiny"), max_connections=2)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    try:
        time.sleep(0.2)
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert r.status_code == 503
    finally:
        for s in idle:
            s.close()
    time.sleep(0.3)
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    srv.should_exit = True
    th.join(timeout=10)


def test_per_client_cap(slow_engine):
    app = create_app(slow_engine, model_name="tiny", max_requests_per_client=2)
    srv, th, port = serve_in_thread(app)
    url = f"http://127.0.0.1:{port}"
    long = {"model": "tiny", "prompt": "x", "max_tokens": 900, "ignore_eos": True, "stream": True}
    try:
        with (
            httpx.stream("POST", url + C, json=long, timeout=60) as a,
            httpx.stream("POST", url + C, json=long, timeout=60) as b,
        ):
            assert (a.status_code, b.status_code) == (200, 200)
            lines = a.iter_lines(), b.iter_lines()  # kept: a dropped iterator closes its connection
            assert all(next(x).startswith("data: ") for x in lines)
            r = httpx.post(url + C, json=COMP, timeout=30)
            assert_error_shape(r, 429, None, r"limit 2")
            assert r.json()["error"]["code"] == "rate_limit_exceeded"
            assert httpx.get(url + "/health").status_code == 200  # only generations count
        deadline = time.monotonic() + 20  # both streams were dropped: their slots come back
        while app.state.server.limiter.in_flight("127.0.0.1") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.post(url + C, json=COMP, timeout=30).status_code == 200
    finally:
        srv.should_exit = True
        th.join(timeout=10)


def test_tokenising_runs_off_the_event_loop(engine, server, monkeypatch):
    url, _ = server
    seen: list[str] = []
    real = engine.tokenizer.encode

    def slow_encode(text, *a, **kw):
        if "SLOW" in text:
            seen.append(threading.current_thread().name)
            time.sleep(2.0)
        return real(text, *a, **kw)

    monkeypatch.setattr(engine.tokenizer, "encode", slow_encode)
    results: list[int] = []
    paths = [
        (C, {**COMP, "prompt": "SLOW prompt"}),
        (CH, {**CHAT, "messages": [{"role": "user", "content": "SLOW"}]}),
    ]

    def post(path: str, body: dict) -> None:
        results.append(httpx.post(url + path, json=body, headers=AUTH, timeout=60).status_code)

    posts = [threading.Thread(target=post, args=pb) for pb in paths]
    for t in posts:
        t.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - t0 < 1.0, "/health waited for tokenisation"
    for t in posts:
        t.join()
    assert results == [200, 200]
    assert len(seen) == 2 and "longmoe-http" not in seen  # not the server's (event loop) thread


def test_tokenizer_releases_the_gil(engine):
    """Tokenising on a worker thread only frees the event loop if the tokenizer lets go of the GIL:
    a Python thread keeps ticking while a long text is encoded."""
    text = "def foo(x): return x * 2  # some words\n" * 3000  # ~120 KB
    ticks: list[float] = []
    done = threading.Event()

    def tick() -> None:
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.002)

    t = threading.Thread(target=tick)
    t.start()
    time.sleep(0.05)
    t0 = time.perf_counter()
    ids = engine.tokenizer.encode(text)
    t1 = time.perf_counter()
    done.set()
    t.join()
    assert len(ids) > 1000
    during = [x for x in ticks if t0 <= x <= t1]
    gaps = [b - a for a, b in zip([t0, *during], [*during, t1], strict=True)]
    assert max(gaps) < max(0.1, (t1 - t0) / 3), (
        f"the loop thread stalled {max(gaps):.2f} s of {t1 - t0:.2f} s"
    )


def test_abandoned_non_streamed_request_is_cancelled(slow_engine):
    engine = slow_engine
    srv, th, port = serve_in_thread(create_app(engine, model_name="tiny", api_key=KEY))
    body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 1000, "ignore_eos": True}).encode()
    head = (f"POST {C} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    before = engine.stats()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(head.encode() + body)
    deadline = time.monotonic() + 20
    while engine.stats()["generated_tokens"] < before["generated_tokens"] + 20:  # tokens are flowing
        assert time.monotonic() < deadline
        time.sleep(0.01)
    s.close()
    while engine.stats()["finished_cancelled"] == before["finished_cancelled"]:
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.02)
    s2 = engine.stats()
    assert s2["generated_tokens"] - before["generated_tokens"] < 900  # it stopped long before max_tokens
    assert (s2["running"], s2["cache_bytes_reserved"]) == (0, 0)
    srv.should_exit = True
    th.join(timeout=10)
