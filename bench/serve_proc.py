"""A real ``longmoe serve`` process on a free port: started by the caller, waited on until ``/ready``,
stopped by its PID. Shared by the benchmarks that measure the server as its users run it
(``bench/rollout_long.py``'s HTTP rows) and the tests (drain, Prometheus, load-balancer tests:
``tests/helpers/serve_proc.py``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

HOST = "127.0.0.1"
START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class ServeProcess:
    proc: subprocess.Popen
    url: str
    port: int
    log: Path  # stdout + stderr (the JSON access log included)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM and the exit status (0 after a clean drain)."""
        self.terminate()
        return self.proc.wait(timeout=timeout)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"longmoe serve exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"longmoe serve not ready in {timeout} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


@contextlib.contextmanager
def serve_process(
    model_dir: Path, *args: str, threads: int = 1, env: dict[str, str] | None = None
) -> Iterator[ServeProcess]:
    """``longmoe serve --model model_dir --port P *args`` (``env`` added to the environment) until the
    block ends (SIGTERM, then SIGKILL after 30 s if it has not exited)."""
    port = free_port()
    cmd = [sys.executable, "-m", "longmoe", "serve", "--model", str(model_dir), "--port", str(port), *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), **(env or {})}
    with tempfile.NamedTemporaryFile("wb", prefix="longmoe-serve-", suffix=".log", delete=False) as f:
        log = Path(f.name)
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
    sp = ServeProcess(proc, f"http://{HOST}:{port}", port, log)
    try:
        wait_ready(sp.url, proc, log)
        yield sp
    finally:
        sp.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        log.unlink(missing_ok=True)
