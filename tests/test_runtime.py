"""The CPU allocator tune: large freed blocks are reused instead of page-faulted in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = r"""
import resource, sys, torch
if sys.argv[1] == "1":
    from longmoe.runtime import retain_freed_memory
    assert retain_freed_memory(force=True)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def step():  # one 64 MB block (above glibc's largest mmap threshold) allocated, touched, freed
    t = torch.ones(64 << 18)
    del t
for _ in range(16):  # warm-up: the heap settles after a few blocks (freed chunks consolidate)
    step()
f0 = faults()
for _ in range(4):
    step()
print(faults() - f0)
"""


def _faults(tuned: bool) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, "1" if tuned else "0"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_retain_freed_memory_stops_refaulting_large_blocks():
    """After warm-up, four 64 MB allocations fault ~64k pages without the tune and almost none with it."""
    plain, tuned = _faults(False), _faults(True)
    assert plain > 4 * 8000  # each fresh mmap faults in its 16k pages
    assert tuned < plain / 20


def test_disabled_by_environment(monkeypatch):
    import longmoe.runtime as rt

    monkeypatch.setattr(rt, "_applied", None)
    monkeypatch.setenv(rt.ENV_VAR, "0")
    assert rt.retain_freed_memory() is False
