"""Shared benchmark plumbing: timing, the machine's GEMM roofline, provenance, results files and tables.

Benchmarks report ratios against a peer measured in the same run (these machines are shared and
noisy), so absolute seconds only matter relative to each other and to ``gemm_roofline``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from bench.tables import table_sha256, write_all
from longmoe.data.corpus import stdlib_documents
from longmoe.data.tokenizer import Tokenizer
from longmoe.report.provenance import DirtyTreeError, require_clean
from longmoe.report.provenance import provenance as shared_provenance
from longmoe.runtime import retain_freed_memory

MALLOC_TUNED = retain_freed_memory()  # every benchmark, both peers: see longmoe/runtime.py

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
STARTED = time.perf_counter()  # a benchmark imports this module first: wall time counts from here

# ``--allow-dirty`` is every benchmark's option, taken here before the script's own parser sees argv: a
# result from uncommitted code is refused (at the start, before hours of measuring, and again when written)
ALLOW_DIRTY = "--allow-dirty" in sys.argv
if ALLOW_DIRTY:
    sys.argv.remove("--allow-dirty")


def _running_a_benchmark() -> bool:
    return bool(sys.argv and sys.argv[0]) and Path(sys.argv[0]).resolve().parent == Path(__file__).parent


def start_commit(argv: list[str], root: Path = ROOT, allow_dirty: bool = False) -> str | None:
    """The commit a benchmark run starts from (``require_clean``: a dirty tree is refused unless allowed);
    None for ``-h``/``--help``, which writes no result, so help works in any tree."""
    if any(a in ("-h", "--help") for a in argv[1:]):
        return None
    return require_clean(allow_dirty, root)


START_COMMIT: str | None = None
if _running_a_benchmark():
    try:
        START_COMMIT = start_commit(sys.argv, ROOT, ALLOW_DIRTY)
    except DirtyTreeError as e:
        raise SystemExit(f"error: {e}") from None


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


def _program() -> str:
    p = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    return f"python -m bench.{p.stem}" if p.parent.name == "bench" else str(p)


def provenance() -> dict:
    """Where a result came from: what ``longmoe report`` prints beside each number (longmoe/report/card.py).

    The commit is the one checked when the benchmark started (the run's own table writes dirty the tree
    after that); a caller that is not a benchmark script is checked now. Either refuses
    (``DirtyTreeError``) a dirty tree unless ``--allow-dirty`` was given."""
    commit = START_COMMIT or require_clean(ALLOW_DIRTY, ROOT)
    command = " ".join([_program(), *sys.argv[1:], *(["--allow-dirty"] if ALLOW_DIRTY else [])])
    out = shared_provenance(command, STARTED, commit)
    if ALLOW_DIRTY:
        out["allow_dirty"] = True
    return out


def spread(xs: list[float]) -> dict:
    """The per-round values' median and [min, max]: the noise a ratio over alternating rounds carries."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def counted_spread(xs: list[float]) -> dict:
    """``spread`` plus the sample count ``n``, for tables that mark a one-sample row or a verdict that
    needs ``MIN_ROUNDS``."""
    return {**spread(xs), "n": len(xs)}


MIN_ROUNDS = 3  # fewer samples than this carry no verdict


def verdict(lo: float, hi: float, n: int, good: Callable[[float], bool]) -> str:
    """ "met" when the whole range [lo, hi] satisfies ``good``, "missed" when none of it does, else not
    settled; fewer than ``MIN_ROUNDS`` samples carry no verdict."""
    if n < MIN_ROUNDS:
        return f"no verdict ({n} sample(s))"
    if good(lo) and good(hi):
        return "met"
    if not good(lo) and not good(hi):
        return "missed"
    return "not settled (range crosses the target)"


def _median_tree(values: list) -> object:
    if isinstance(values[0], dict):
        return {k: _median_tree([v[k] for v in values]) for k in values[0]}
    if all(v == values[0] for v in values):
        return values[0]  # a label or a setting (a name, T, a dtype): the same in every round, type kept
    if isinstance(values[0], (int, float)) and not isinstance(values[0], bool):
        return statistics.median(values)
    return values[0]


def over_rounds(per_round: list[dict], *, timed: Sequence[str], ratios: dict[str, str]) -> dict:
    """One row measured once in each round -> the row a result file keeps.

    Every number is its median over rounds under its own key (a dict of numbers, e.g. seconds by
    implementation, key by key; labels from the first round). For each ratio key (a value, or a dict of
    values, computed within each round) ``ratios[key]`` gets the per-round values' ``spread``: their
    median and [min, max] (naming the key itself keeps only the spread). ``rounds`` keeps the per-round
    values of the ``timed`` keys (none named: no ``rounds``). Every round holds the same keys."""
    row = {k: _median_tree([r[k] for r in per_round]) for k in per_round[0]}
    for key, out in ratios.items():
        vals = [r[key] for r in per_round]
        by_name = isinstance(vals[0], dict)
        row[out] = {n: spread([v[n] for v in vals]) for n in vals[0]} if by_name else spread(vals)
    if timed:
        row["rounds"] = [{k: r[k] for k in timed} for r in per_round]
    return row


def range_cell(s: dict, spec: str = ".2f", unit: str = "") -> str:
    """A ``spread`` as tables show a ratio over rounds: ``median [min, max]``."""
    return f"{s['median']:{spec}}{unit} [{s['min']:{spec}}, {s['max']:{spec}}]"


def add_rounds_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--rounds",
        type=int,
        help="alternating rounds: the whole grid N times, each arm's median and each ratio's per-round "
        "[min, max] kept (default 3; --quick: 1)",
    )


def rounds_arg(ap: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--rounds``, else 1 for ``--quick`` and 3 otherwise (issue 50: a verdict rests on 3 or more)."""
    n = args.rounds if args.rounds is not None else 1 if getattr(args, "quick", False) else 3
    if n < 1:
        ap.error("--rounds must be at least 1")
    return n


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
    try:
        prov = provenance()
    except DirtyTreeError as e:
        raise SystemExit(f"error: {e}") from None
    payload = {
        "benchmark": name,
        "machine": machine_info(),
        "provenance": prov,
        "table_sha256": table_sha256(table_md),
        **payload,
    }
    out = RESULTS / f"{name}.json"
    tmp = out.with_suffix(".json.tmp")  # atomic: a killed run leaves the previous result whole
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(out)
    (RESULTS / f"{name}.md").write_text(table_md + "\n")
    if update_readme:
        write_all(ROOT, add_bench=name)
    print(table_md)
    print(f"wrote {out.relative_to(ROOT)}")
    return out
