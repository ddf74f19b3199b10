"""Shared benchmark plumbing: timing, the machine's GEMM roofline, provenance, results files and tables.

Benchmarks report ratios against a peer measured in the same run (these machines are shared and
noisy), so absolute seconds only matter relative to each other and to ``gemm_roofline``.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import json
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.tables import table_sha256, write_all
from longmoe.data.corpus import stdlib_documents
from longmoe.data.tokenizer import Tokenizer
from longmoe.runtime import retain_freed_memory

MALLOC_TUNED = retain_freed_memory()  # every benchmark, both peers: see longmoe/runtime.py

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
STARTED = time.perf_counter()  # a benchmark imports this module first: wall time counts from here


@functools.lru_cache(maxsize=4)
def bench_tokenizer(vocab_size: int = 512, n_docs: int = 60) -> Tokenizer:
    """A small BPE trained on a slice of the standard-library corpus (~1 s): the benchmarks time
    models, not tokenizers, so any real tokenizer of the right vocabulary will do."""
    texts = (d.text for d in itertools.islice(stdlib_documents("train", "file"), n_docs))
    return Tokenizer.train(texts, vocab_size=vocab_size)


def timeit(
    fn: Callable[[], object],
    *,
    warmup: int = 1,
    iters: int = 3,
    max_seconds: float = 60.0,
    stat: Callable[[list[float]], float] = statistics.median,
) -> float:
    """Wall time of ``fn()`` in seconds, ``stat`` (median) over ``iters`` runs (fewer once ``max_seconds``
    is spent)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > max_seconds:
            break
    return stat(times)


def gemm_roofline(dtype: torch.dtype = torch.float32, n: int = 1024, iters: int = 9) -> float:
    """Peak measured ``torch.mm`` throughput (FLOP/s) of an n×n×n product in ``dtype`` on this machine.

    The *fastest* of ``iters`` runs, not the median: on a shared machine a slow sample is interference,
    and a roofline read low would flatter every share reported against it.
    """
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    return 2.0 * n**3 / timeit(lambda: torch.mm(a, b), warmup=2, iters=iters, stat=min)


def machine_info() -> dict:
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "malloc_tuned": MALLOC_TUNED,  # LONGMOE_MALLOC_TUNE=0 runs with glibc's default mmap/trim
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    """HEAD's short hash, ``+dirty`` when tracked files differ from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _program() -> str:
    p = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    return f"python -m bench.{p.stem}" if p.parent.name == "bench" else str(p)


def provenance() -> dict:
    """Where a result came from: what ``longmoe report`` prints beside each number (longmoe/reportcard.py)."""
    return {
        "commit": _git_commit(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{socket.gethostname()}, {_cpu_model()}",
        "threads": torch.get_num_threads(),
        "command": " ".join([_program(), *sys.argv[1:]]),
        "wall_s": round(time.perf_counter() - STARTED, 1),
    }


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    def fmt(x: object) -> str:
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def write_results(name: str, payload: dict, table_md: str, *, update_readme: bool = True) -> Path:
    """Write ``bench/results/<name>.json`` (with its provenance) and ``<name>.md``; refresh the tables.

    docs/benchmarks.md holds one section per benchmark between ``<!-- bench:<name>:start -->`` and
    ``<!-- bench:<name>:end -->`` markers (a missing one is added); ``bench.tables`` rewrites every table
    there and the README's headline table from the result files (``update_readme=False``: results only).
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "machine": machine_info(),
        "provenance": provenance(),
        "table_sha256": table_sha256(table_md),
        **payload,
    }
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(payload, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(table_md + "\n")
    if update_readme:
        write_all(ROOT, add_bench=name)
    print(table_md)
    print(f"wrote {out.relative_to(ROOT)}")
    return out
