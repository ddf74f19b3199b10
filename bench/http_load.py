"""Concurrent HTTP clients against a server child process: the driver the serving comparisons share.

``run_clients`` sends N ``/v1/completions`` requests at once (one asyncio client each) and returns a
``Sample``: the generated tokens the responses report (``usage.completion_tokens`` of the requests that
succeeded), the wall from the first request sent to the last response, and every failure's status and
body (not 200, or ``finish_reason`` "error"). ``Server`` runs a server as a child process on a free
127.0.0.1 port, logging to a file, waited on until its readiness route answers 200 and stopped by PID;
``cpu_seconds`` reads a process's CPU time from ``/proc``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"
START_TIMEOUT_S, REQUEST_TIMEOUT_S = 600.0, 600.0


@dataclass
class Sample:
    """One measurement: N requests sent at once."""

    clients: int
    wall_s: float
    tokens: int  # generated, from the successful responses
    ok: int
    failures: list[str] = field(default_factory=list)  # status and body of each failed request
    server_cpu_s: float | None = None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    def to_dict(self) -> dict:
        return {
            "clients": self.clients,
            "wall_s": self.wall_s,
            "tokens": self.tokens,
            "ok": self.ok,
            "tok_s": self.tok_s,
            "failures": self.failures,
            "server_cpu_s": self.server_cpu_s,
        }


def outcome(status: int, body: str) -> tuple[int, str | None]:
    """(generated tokens, None) for a successful ``/v1/completions`` response, else (0, why)."""
    try:
        data = json.loads(body)
        choice = data["choices"][0]
        n = int(data["usage"]["completion_tokens"])
    except (ValueError, KeyError, IndexError, TypeError):
        return 0, f"{status}: {body[:400]}"
    if status != 200 or choice.get("finish_reason") in (None, "error"):
        return 0, f"{status} finish_reason={choice.get('finish_reason')}: {body[:400]}"
    return n, None


async def _drive(url: str, bodies: list[dict], transport: httpx.AsyncBaseTransport | None) -> Sample:
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=len(bodies) + 4)
    async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S, transport=transport) as client:

        async def one(body: dict) -> tuple[int, str | None]:
            try:
                r = await client.post(url + "/v1/completions", json=body)
            except httpx.HTTPError as e:
                return 0, f"{type(e).__name__}: {e}"
            return outcome(r.status_code, r.text)

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(b) for b in bodies))
        wall = time.perf_counter() - t0
    fails = [why for _, why in done if why is not None]
    return Sample(len(bodies), wall, sum(n for n, _ in done), len(bodies) - len(fails), fails)


def run_clients(
    url: str,
    ids: list[list[int]],
    new_tokens: int,
    *,
    model: str = "m",
    transport: httpx.AsyncBaseTransport | None = None,
) -> Sample:
    """Every prompt of ``ids`` sent at once, one client each, greedy, ``new_tokens`` each; the wall from the
    first request sent to the last response."""
    bodies = [
        {"model": model, "prompt": p, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        for p in ids
    ]
    return asyncio.run(_drive(url, bodies, transport))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A server child process on a free port, logging to ``log``; ``ready_path`` answers 200 once it
    serves (longmoe ``/ready``: loaded and compiled; llama-server ``/health``: loaded)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], ready_path: str, log: Path):
        self.name, self.cmd, self.log = name, cmd, log
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://{HOST}:{self.port}"
        self.ready_path = ready_path
        with log.open("wb") as fh:
            self.proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=fh, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + self.ready_path, timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not come up ({' '.join(self.cmd)}):\n{self.tail()}")
            time.sleep(0.5)

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 30 s."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
