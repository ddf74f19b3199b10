"""Where a result came from: commit, date, machine, threads, command, wall time and peer versions.

Every benchmark JSON (``bench/common.py``) and every recipe run (``longmoe recipe``: ``OUT/provenance.json``)
records this, and ``longmoe report`` prints it beside each number (``longmoe/report/card.py``). A result
written from a tree with uncommitted changes cannot be traced to code, so writers refuse one unless told
``--allow-dirty`` (``require_clean``), and the commit then reads ``<hash>+dirty``.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import socket
import subprocess
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]  # the checkout when longmoe runs from one (longmoe/report/)
# the packages a result is read against (peers) or run on; a missing one is left out
PEER_PACKAGES = ("torch", "transformers", "flash-linear-attention", "llama-cpp-python", "gguf")


class DirtyTreeError(RuntimeError):
    """A result about to be written from a checkout with uncommitted changes (and no ``--allow-dirty``)."""


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


def require_clean(allow_dirty: bool, root: Path = REPO) -> str | None:
    """The commit a result will carry; a dirty checkout raises ``DirtyTreeError`` unless ``allow_dirty``."""
    commit = git_commit(root)
    if commit is not None and commit.endswith("+dirty") and not allow_dirty:
        raise DirtyTreeError(
            f"{root}: uncommitted changes to tracked files; commit them first (a result must name the code "
            "that made it) or pass --allow-dirty to stamp the result '+dirty'"
        )
    return commit


def peer_versions() -> dict[str, str]:
    """Installed versions of the packages results are measured on or against (``PEER_PACKAGES``)."""
    out = {}
    for name in PEER_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages: how busy a shared machine was around a timing."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def provenance(command: str, started: float, commit: str | None = None) -> dict:
    """The record for a result made by ``command`` since ``started`` (a ``time.perf_counter()``); ``commit``
    is the one checked when the run began (``require_clean``), else HEAD now."""
    return {
        "commit": commit if commit is not None else git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{socket.gethostname()}, {cpu_model()}",
        "threads": torch.get_num_threads(),
        "command": command,
        "wall_s": round(time.perf_counter() - started, 1),
        "cpu_s": round(time.process_time(), 1),  # this process's CPU time (threads summed)
        "load_average_at_end": load_average(),
        "peers": peer_versions(),
    }
