"""``longmoe serve`` opens its port before the model loads: while loading, ``/health`` is 200,
``/ready`` 503 (reason ``loading``) and the API 503 with ``Retry-After``; once the engine is built the
same port serves (``/ready`` 200, a chat completes); SIGTERM while loading exits 0 at once.

The load is held open from the test side only: a ``sitecustomize`` on the child's ``PYTHONPATH``
makes ``safetensors.torch.load_file`` wait for a gate file, so the child is the real CLI, unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from longmoe.serve.api.lifecycle import Booting
from tests.helpers.serve_proc import HOST, free_port

GATE_HOOK = """
import os, time
import safetensors.torch as st
_load = st.load_file
def load_file(*a, **k):
    while not os.path.exists(os.environ["LONGMOE_TEST_LOAD_GATE"]):
        time.sleep(0.02)
    return _load(*a, **k)
st.load_file = load_file
"""


def start(model_dir: Path, tmp_path: Path) -> tuple[subprocess.Popen, str, Path, Path]:
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(GATE_HOOK)
    gate, log = tmp_path / "gate", tmp_path / "serve.log"
    path = os.pathsep.join(p for p in (str(tmp_path / "hook"), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "LONGMOE_TEST_LOAD_GATE": str(gate), "OMP_NUM_THREADS": "1"}
    port = free_port()
    cmd = [sys.executable, "-m", "longmoe", "serve", "--model", str(model_dir), "--port", str(port)]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    return proc, f"http://{HOST}:{port}", gate, log


def wait_listening(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return httpx.get(url + "/health", timeout=5)
        except httpx.TransportError:
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
    raise TimeoutError(log.read_text()[-3000:])


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


@pytest.mark.slow(wall="~8 s (one run, shared 2-core CPU)")
def test_the_port_answers_not_ready_while_the_model_loads_then_serves(model_dir, tmp_path):
    proc, url, gate, log = start(model_dir, tmp_path)
    try:
        health = wait_listening(url, proc, log)
        assert health.status_code == 200 and health.json()["status"] == "loading"
        ready = httpx.get(url + "/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["reason"] == "loading"
        body = {"model": model_dir.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for method, path, kw in (("POST", "/v1/chat/completions", {"json": body}), ("GET", "/v1/models", {})):
            r = httpx.request(method, url + path, timeout=5, **kw)
            assert r.status_code == 503 and r.headers["Retry-After"] == str(5)
            assert r.json()["error"]["code"] == "model_loading"
        gate.touch()  # let the model load
        deadline = time.monotonic() + 120
        while httpx.get(url + "/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
        assert httpx.get(url + "/health", timeout=5).json()["status"] == "ok"
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]


@pytest.mark.slow(wall="~6 s (one run, shared 2-core CPU)")
def test_sigterm_while_loading_exits_zero(model_dir, tmp_path):
    proc, url, _, log = start(model_dir, tmp_path)
    try:
        assert wait_listening(url, proc, log).status_code == 200
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]


def test_booting_hands_every_request_to_the_app_once_started():
    """The swap is one reference: after ``start`` no request sees the loading answers."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    app = FastAPI()
    app.add_api_route("/ready", lambda: {"ready": True})
    b = Booting("m")
    c = TestClient(b)  # not as a context: lifespan is off under uvicorn_config
    assert c.get("/ready").status_code == 503
    assert c.get("/anything").headers["Retry-After"] == str(5)
    b.start(app)
    assert c.get("/ready").json() == {"ready": True}
