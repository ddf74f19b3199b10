"""Process-level CPU runtime: keep freed memory for reuse instead of returning it to the kernel, and
how much memory is left to allocate.

PyTorch's CPU allocator is plain ``malloc``. glibc serves every block above its mmap threshold (at most
32 MB) with a fresh ``mmap`` and unmaps it on free, so a tensor that size is page-faulted in (and
zeroed by the kernel) on *every* allocation. A MoE layer with E = 896 experts allocates ~0.7 GB of
expert-weight gradients plus ~0.3 GB of padded dispatch buffers per step: measured on 2 cores, 310k
minor faults and 0.8 s of system time per forward+backward, more than half the compute.

``retain_freed_memory`` turns ``mmap`` off for large blocks and heap trimming off, so such blocks come
from the heap and are reused across steps: the role a caching allocator plays on GPU, or jemalloc /
tcmalloc on CPU (which PyTorch's CPU tuning guide recommends). The cost: the process keeps its peak
heap (RSS does not shrink after a large step), which is what a training or serving process wants.

It is applied by the ``longmoe`` CLI and the benchmarks (both peers in a benchmark share the process,
so comparisons stay fair); ``LONGMOE_MALLOC_TUNE=0`` disables it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
ENV_VAR = "LONGMOE_MALLOC_TUNE"
_applied: bool | None = None


def _libc_function(name: str):  # noqa: ANN202 (a ctypes function pointer)
    """The C library's function ``name``, or None where there is no such library or function."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def retain_freed_memory(force: bool = False) -> bool:
    """On glibc Linux, stop ``malloc`` from mmapping large blocks and trimming the heap.

    Returns True when the setting is in effect (applied now or earlier), False where it does not apply
    (not Linux/glibc, or disabled by ``LONGMOE_MALLOC_TUNE=0`` unless ``force``). Idempotent.
    """
    global _applied
    if _applied is not None and not force:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux") or (os.environ.get(ENV_VAR, "1") == "0" and not force):
        return False
    mallopt = _libc_function("mallopt")
    if mallopt is None:  # musl and others have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # trim threshold is an int here: 2**31 - 1 bytes of free heap top is never reached in practice
    ok = mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, 2**31 - 1) == 1
    _applied = ok
    return ok


def release_freed_memory() -> bool:
    """Return the heap's free pages to the kernel now (glibc ``malloc_trim(0)``).

    With ``retain_freed_memory`` on, a freed model stays resident and the next one reuses its pages, so a
    resident-memory delta measured across a load reads ~0. Call this before such a measurement. Returns
    False where there is no ``malloc_trim`` (not glibc)."""
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def available_memory_bytes() -> int | None:
    """Memory this process can still allocate: ``MemAvailable`` (free + reclaimable cache) capped by
    the cgroup limit, else the physical total from ``sysconf``; None where none is known."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024  # kB
                    break
    except (OSError, ValueError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):  # not POSIX, or the names are unknown
            return None
    try:  # a container's limit (cgroup v2) can be far below the machine's memory
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            avail = min(avail, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail
