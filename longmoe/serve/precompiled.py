"""Precompiled decode steps on disk: a second process loads the compiled step instead of tracing again.

Inductor's caches (FX graph, AOTAutograd) spare a warm process the C++ build, but not dynamo: tracing the
0.3B model's decode step through every layer still took ~4 s of a ~7-9 s warm compile. ``torch.compile``'s
``aot_compile`` captures the whole step once (the graph, its guards and inductor's compiled code) into one
serializable function; loading it skips tracing and compiling (about 2 s for the 0.3B model).

Such a file holds the *traced code*, so its key must change whenever what was traced could: it hashes the
torch and Python versions, the CPU's instruction-set flags (the compiled C++ is built for them), this
package's sources (any edit to ``longmoe`` invalidates it), the model's class, config and the name, dtype
and shape of every parameter and buffer (weights are inputs, not constants, so any checkpoint of the same
shapes shares it), the backend, its options and the graph kind. A file that fails to load is moved aside
and the step compiles again: a cache may be slow, never wrong. Old files beyond ``KEEP`` are pruned.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)
KEEP = 32  # newest artifacts kept per directory (one model's two graph kinds use 2)
SUFFIX = ".pt2fn"


def tree_digest(root: Path) -> str:
    """sha256 over every ``.py`` file under ``root`` (relative path and bytes)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def source_digest() -> str:
    """``tree_digest`` of the ``longmoe`` package, once per process: the code a step traced."""
    return tree_digest(Path(__file__).resolve().parents[1])


@functools.cache
def machine_tag() -> str:
    """The architecture and the CPU's feature flags (``/proc/cpuinfo``): compiled C++ runs only where
    they match. Reading them costs microseconds, unlike inductor's ISA probe (a compile, seconds)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()}:{hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def artifact_key(model: torch.nn.Module, backend: str, options: str, kind: str) -> str:
    """The file name's hash (module docstring: everything the compiled step depends on)."""
    h = hashlib.sha256()
    cfg = getattr(model, "cfg", None)
    parts = [
        torch.__version__, sys.version, machine_tag(), source_digest(), type(model).__qualname__,
        repr(cfg.to_dict() if hasattr(cfg, "to_dict") else cfg), backend, options, kind,
    ]  # fmt: skip
    for part in parts:
        h.update(part.encode() + b"\0")
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}:{t.device.type}\0".encode())
    return h.hexdigest()[:32]


class PrecompiledStore:
    """Load and save ``aot_compile``'d steps under ``directory`` (one file per key)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def load(self, key: str, model: torch.nn.Module) -> Any | None:
        """The compiled function saved under ``key``, or None (none saved, or unreadable: moved aside)."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            with open(path, "rb") as f:
                fn = torch.compiler.load_compiled_function(f, external_data={"model": model})
        except Exception as e:  # noqa: BLE001 - any failure means "compile again", never a crash
            logger.warning("precompiled step %s unreadable (%s: %s); compiling", path, type(e).__name__, e)
            path.replace(path.with_suffix(".bad"))
            return None
        os.utime(path)  # recently used: kept by the pruning
        return fn

    def save(self, key: str, fn: Any, model: torch.nn.Module) -> Path | None:
        """Write ``fn`` atomically (torch writes a temp file and renames); None if it cannot be saved."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(key)
        try:
            fn.save_compiled_function(str(path), external_data={"model": model})
        except Exception as e:  # noqa: BLE001 - a step that cannot be saved still runs
            logger.warning("precompiled step not saved (%s: %s)", type(e).__name__, e)
            return None
        self.prune()
        return path

    def prune(self, keep: int = KEEP) -> None:
        """Delete all but the ``keep`` most recently used artifacts (and any moved-aside ``.bad`` file)."""
        files = sorted(self.directory.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
        for p in [*files[keep:], *self.directory.glob("*.bad")]:
            p.unlink(missing_ok=True)
