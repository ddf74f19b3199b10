"""Readiness and graceful drain: ``/ready`` is 200 when serving and 503 while a ``--compile`` warm-up
has no graph yet or while draining; draining turns new work away with 503 + ``Retry-After`` while
``/health`` and ``/metrics`` still answer; a real ``longmoe serve`` given SIGTERM with streams in
flight lets every stream finish (finish reason, ``[DONE]``, every token), refuses new requests, and
exits 0; streams longer than ``--drain-timeout`` end with a retryable error event, never silently."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from longmoe.serve.api import create_app
from longmoe.serve.api.lifecycle import Lifecycle
from tests.helpers.serve_proc import serve_process

STREAM = {
    "prompt": "count:",
    "max_tokens": 120,
    "ignore_eos": True,
    "stream": True,
    "temperature": 0,
    "stream_options": {"include_usage": True},
}


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


def test_ready_until_drain_then_new_work_is_refused(engine):
    app = create_app(engine, model_name="tiny")
    c = TestClient(app, base_url="http://localhost")
    assert c.get("/ready").json() == {"ready": True, "model": "tiny"}
    app.state.server.lifecycle.drain()
    r = c.get("/ready")
    assert r.status_code == 503 and r.json()["reason"] == "draining"
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        r = c.post(path, json=body)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", path
        assert r.json()["error"]["code"] == "server_draining"
    assert c.get("/v1/models").status_code == 503
    assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200


def test_not_ready_while_the_compile_warmup_has_no_graph():
    graphs = [0]
    compiled = SimpleNamespace(report=lambda: {"compiled_graphs": graphs[0]})
    eng = SimpleNamespace(compiled=compiled, cfg=SimpleNamespace(compile_warmup=True))
    life = Lifecycle()
    assert life.not_ready(eng) == "compiling"
    graphs[0] = 1
    assert life.not_ready(eng) is None
    eng.cfg.compile_warmup = False  # compiling at the first decode step: ready at once (else no traffic ever)
    graphs[0] = 0
    assert life.not_ready(eng) is None


def _stream(url: str, out: dict, i: int, started: threading.Event, body: dict = STREAM) -> None:
    tokens, finish, done, error = None, None, False, None
    try:
        with httpx.stream("POST", url + "/v1/completions", json={"model": "m", **body}, timeout=120) as r:
            out[i] = {"status": r.status_code}
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                started.set()
                if line == "data: [DONE]":
                    done = True
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    error = ev["error"]
                    continue
                if ev.get("usage"):
                    tokens = ev["usage"]["completion_tokens"]
                if ev["choices"]:
                    finish = ev["choices"][0]["finish_reason"] or finish
    except httpx.HTTPError as e:
        error = {"transport": repr(e)}
    out[i].update(finish=finish, done=done, error=error, tokens=tokens)


def _run_streams(url: str, n: int) -> tuple[dict, list[threading.Thread]]:
    out: dict = {}
    threads = []
    for i in range(n):
        ev = threading.Event()
        t = threading.Thread(target=_stream, args=(url, out, i, ev), daemon=True)
        t.start()
        assert ev.wait(60), "stream did not start"
        threads.append(t)
    return out, threads


def test_sigterm_drains_streams_in_flight_and_exits_0(model_dir):
    with serve_process(model_dir, "--model-name", "m", "--drain-timeout", "120") as sp:
        out, threads = _run_streams(sp.url, 3)
        os.kill(sp.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(sp.url + "/ready").status_code != 503:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        r = httpx.post(sp.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        for t in threads:
            t.join(120)
        assert sp.proc.wait(timeout=60) == 0
        for i in range(3):
            assert out[i] == {
                "status": 200,
                "finish": "length",
                "done": True,
                "error": None,
                "tokens": 120,
            }, out
        log = sp.output()
        assert '"event": "drained"' in log and '"in_flight_at_sigterm": 3' in log


@pytest.mark.slow(wall="not measured (a served process and a drain)")
def test_streams_past_the_drain_timeout_end_with_a_retryable_error(model_dir):
    with serve_process(model_dir, "--model-name", "m", "--drain-timeout", "0.5") as sp:
        out: dict = {}
        ev = threading.Event()
        t = threading.Thread(
            target=_stream, args=(sp.url, out, 0, ev, {**STREAM, "max_tokens": 900}), daemon=True
        )
        t.start()
        assert ev.wait(60)
        os.kill(sp.proc.pid, signal.SIGTERM)
        t.join(120)
        assert sp.proc.wait(timeout=60) == 0
        res, log = out[0], sp.output()
        assert res["error"] is not None and res["error"].get("code") == "server_shutting_down", (res, log)
        assert res["finish"] is None and res["done"]  # cut: no chunk claims it finished; the stream closes
        assert '"event": "drain_timeout"' in log and '"in_flight_at_sigterm": 1' in log
