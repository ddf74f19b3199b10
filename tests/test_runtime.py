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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim")
def test_release_freed_memory_gives_a_freed_block_back_to_the_kernel():
    """With the tune on, a freed 256 MB block stays resident until ``release_freed_memory``."""
    code = r"""
import torch
from longmoe.runtime import release_freed_memory, retain_freed_memory
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS:")).split()[1]) << 10
assert retain_freed_memory(force=True)
t = torch.ones(64 << 20)  # 256 MB, touched
r0 = rss()
del t
r1 = rss()
assert release_freed_memory()
print(r0 - r1, r0 - rss())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    kept, released = (int(x) for x in out.stdout.split())
    assert kept < 32 << 20 and released > 200 << 20


def test_disabled_by_environment(monkeypatch):
    import longmoe.runtime as rt

    monkeypatch.setattr(rt, "_applied", None)
    monkeypatch.setenv(rt.ENV_VAR, "0")
    assert rt.retain_freed_memory() is False
