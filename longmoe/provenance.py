"""Where a result came from: commit, date, machine, threads, command and wall time.

Every benchmark JSON (``bench/common.py``) and every recipe run (``longmoe recipe``: ``OUT/provenance.json``)
records this, and ``longmoe report`` prints it beside each number (``longmoe/reportcard.py``).
"""

from __future__ import annotations

import datetime
import platform
import socket
import subprocess
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent  # the checkout when longmoe runs from one


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(root: Path = REPO) -> str | None:
    """HEAD's short hash, ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance(command: str, started: float) -> dict:
    """The record for a result made by ``command`` since ``started`` (a ``time.perf_counter()``)."""
    return {
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{socket.gethostname()}, {cpu_model()}",
        "threads": torch.get_num_threads(),
        "command": command,
        "wall_s": round(time.perf_counter() - started, 1),
    }
