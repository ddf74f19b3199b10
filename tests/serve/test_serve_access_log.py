"""One JSON line per request on ``longmoe.access`` (request id, hashed key, route, status, tokens,
TTFT, duration, finish reason, cached tokens), ``X-Request-Id`` taken when plain and echoed (replaced
when not), the key never in the log; OpenTelemetry spans (queue -> prefill -> decode under one
request span) when a tracer is configured."""

from __future__ import annotations

import hashlib
import json
import logging
import time

import httpx
import pytest

from longmoe.serve.api import create_app
from longmoe.serve.api.access import key_id, request_id
from longmoe.serve.api.tracing import Tracer
from tests.helpers.server import serving, wait_idle

KEY = "sk-test-key-123"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(prefill_chunk=16)


@pytest.fixture(scope="module")
def spans():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def url(engine, spans):
    app = create_app(engine, model_name="tiny", api_key=KEY, tracer=Tracer(spans, batch=False))
    with serving(app) as u:
        yield u


def _lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "longmoe.access"]


def _line(caplog, rid: str, timeout: float = 10.0) -> dict:
    """The one line of request ``rid`` (the server logs it just after the client has the last byte)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [x for x in _lines(caplog) if x["request_id"] == rid]
        if found or time.monotonic() > deadline:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.02)


def test_a_completion_logs_one_line_with_its_numbers(url, engine, caplog):
    caplog.set_level(logging.INFO, logger="longmoe.access")
    body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 5, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, headers={**AUTH, "X-Request-Id": "req-42"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-42"
    wait_idle(engine)
    line = _line(caplog, "req-42")
    u = r.json()["usage"]
    assert line["route"] == "/v1/completions" and line["method"] == "POST" and line["status"] == 200
    assert line["prompt_tokens"] == u["prompt_tokens"] and line["completion_tokens"] == 5
    assert line["cached_tokens"] == u["prompt_tokens_details"]["cached_tokens"]
    assert line["finish_reason"] == "length" and line["error"] is None and line["disconnected"] is False
    assert 0 < line["ttft_s"] <= line["duration_s"]
    assert line["key_id"] == hashlib.sha256(KEY.encode()).hexdigest()[:12]
    assert all(KEY not in r.getMessage() for r in caplog.records)


def test_a_stream_is_logged_when_its_last_byte_is_sent(url, caplog):
    caplog.set_level(logging.INFO, logger="longmoe.access")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=chat, headers=AUTH, timeout=60) as s:
        rid = s.headers["x-request-id"]
        assert len(rid) == 32  # none given: a fresh uuid4 hex
        body = "".join(s.iter_lines())
    assert "[DONE]" in body
    line = _line(caplog, rid)
    assert line["status"] == 200 and line["completion_tokens"] is not None and line["finish_reason"]


@pytest.mark.parametrize("bad", ["x" * 129, "a b", "id\u00e9", ""])
def test_an_unsafe_request_id_is_replaced(url, bad, caplog):
    caplog.set_level(logging.INFO, logger="longmoe.access")
    r = httpx.get(url + "/health", headers=[(b"X-Request-Id", bad.encode("utf-8"))])
    assert r.status_code == 200 and r.headers["x-request-id"] != bad and len(r.headers["x-request-id"]) == 32
    assert request_id(bad) != bad


def test_refused_requests_are_logged_too(url, caplog):
    caplog.set_level(logging.INFO, logger="longmoe.access")
    r = httpx.post(url + "/v1/completions", json={}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    line = _line(caplog, r.headers["x-request-id"])
    assert line["status"] == 401 and line["key_id"] == key_id("Bearer wrong")
    assert line["prompt_tokens"] is None


def test_key_id_is_none_without_a_bearer_token():
    assert key_id("") is None and key_id("Basic abc") is None
    assert key_id("Bearer a") != key_id("Bearer b")


def test_each_request_is_a_trace_of_queue_prefill_decode(url, engine, spans):
    spans.clear()
    body = {"model": "tiny", "prompt": "trace me", "max_tokens": 4, "ignore_eos": True}
    headers = {**AUTH, "X-Request-Id": "trace-1"}
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200
    wait_idle(engine)
    got = {s.name: s for s in spans.get_finished_spans()}
    assert set(got) == {"longmoe.request", "queue", "prefill", "decode"}
    root = got["longmoe.request"]
    assert root.attributes["longmoe.request_id"] == "trace-1"
    assert root.attributes["gen_ai.usage.output_tokens"] == 4
    for name in ("queue", "prefill", "decode"):
        assert got[name].parent.span_id == root.context.span_id
        assert got[name].context.trace_id == root.context.trace_id
    q, p, d = got["queue"], got["prefill"], got["decode"]
    assert root.start_time <= q.start_time <= q.end_time <= p.start_time + 1_000
    assert p.end_time <= d.start_time + 1_000 and d.end_time <= root.end_time + 1_000


def test_a_failing_exporter_never_fails_a_request(make_engine):
    class Broken:
        def export(self, batch):
            raise RuntimeError("collector down")

        def shutdown(self):
            pass

    e = make_engine()
    try:
        app = create_app(e, model_name="tiny", tracer=Tracer(Broken(), batch=False))
        with serving(app) as u:
            body = {"model": "tiny", "prompt": "x", "max_tokens": 3}
            for _ in range(2):
                assert httpx.post(u + "/v1/completions", json=body, timeout=60).status_code == 200
    finally:
        e.close()
