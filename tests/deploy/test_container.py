"""The image (deploy/Containerfile, ``make image``) builds with podman, serves a chat through its
published port with the model mounted as a volume, runs as a non-root user, and on ``podman stop``
(SIGTERM through tini, PID 1) drains and exits 0. Slow tier: the build installs torch and longmoe
(minutes when its layers are not cached); skipped with the reason without podman."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.helpers.serve_proc import free_port

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/longmoe:test"
podman = shutil.which("podman")
pytestmark = [
    pytest.mark.slow(wall="not measured (a podman image build)"),
    pytest.mark.skipif(podman is None, reason="podman not installed (apt-get install podman buildah runc)"),
]
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "deploy" / "containers.conf")}


def _podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([podman, *args], env=ENV, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"podman {' '.join(args)}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_image_builds_serves_a_chat_and_drains_on_sigterm(model_dir):
    build = subprocess.run(
        ["make", "image", f"IMAGE={IMAGE}"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=1800
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    os.chmod(model_dir, 0o755)
    for p in model_dir.rglob("*"):
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    name, port = f"longmoe-test-{uuid.uuid4().hex[:8]}", free_port()
    _podman(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-v", f"{model_dir}:/models/model:ro",
        IMAGE, "--model", "/models/model", "--host", "0.0.0.0", "--port", "8000", "--allowed-hosts", "*",
        "--model-name", "tiny", "--drain-timeout", "20",
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, _podman("logs", name, check=False).stderr[-3000:]
            time.sleep(1)
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        r = httpx.post(url + "/v1/chat/completions", json=chat, timeout=300)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        assert r.headers.get("x-request-id")
        user = _podman("exec", name, "id", "-u").stdout.strip()
        assert user != "0"
        _podman("stop", "-t", "40", name, timeout=120)
        state = json.loads(_podman("inspect", name).stdout)[0]["State"]
        assert state["ExitCode"] == 0, state
        logs = _podman("logs", name).stderr + _podman("logs", name).stdout
        assert '"event": "drained"' in logs
        assert '"route": "/v1/chat/completions", "status": 200' in logs
    finally:
        _podman("rm", "-f", name, check=False)
