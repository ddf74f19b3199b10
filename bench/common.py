"""Shared benchmark plumbing: timing, the machine's GEMM roofline, results files, README tables.

Benchmarks report ratios against a peer measured in the same run (these machines are shared and
noisy), so absolute seconds only matter relative to each other and to ``gemm_roofline``.
"""

from __future__ import annotations

import functools
import itertools
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from longmoe.data.corpus import stdlib_documents
from longmoe.data.tokenizer import Tokenizer
from longmoe.runtime import retain_freed_memory

MALLOC_TUNED = retain_freed_memory()  # every benchmark, both peers: see longmoe/runtime.py

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


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


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    def fmt(x: object) -> str:
        if isinstance(x, float):
            return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)


def write_results(name: str, payload: dict, table_md: str, *, update_readme: bool = True) -> Path:
    """Write ``bench/results/<name>.json`` and ``<name>.md``; refresh the README section for ``name``.

    The README holds one section per benchmark between ``<!-- bench:<name>:start -->`` and
    ``<!-- bench:<name>:end -->`` markers; a missing section is appended inside the benchmarks block.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "machine": machine_info(), **payload}
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(payload, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(table_md + "\n")
    if update_readme:
        _update_readme(name, table_md)
    print(table_md)
    print(f"wrote {out.relative_to(ROOT)}")
    return out


def _update_readme(name: str, table_md: str) -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{table_md}\n{end}"
    if start in text and end in text:
        pre, rest = text.split(start, 1)
        _, post = rest.split(end, 1)
        text = pre + block + post
    elif "<!-- bench:end -->" in text:
        text = text.replace("<!-- bench:end -->", f"{block}\n\n<!-- bench:end -->")
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    readme.write_text(text)
