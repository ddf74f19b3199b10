"""Before/after of a change: ``bench.serve --quick`` and ``bench.model --quick`` run alternately on two
source trees (``--base``: e.g. ``git archive main``; ``--new``: the branch), ``--rounds`` rounds in one
run, so both arms see the same machine load. Each row: the median and [min, max] per arm, and whether
each median lies inside the other arm's range ("within noise") or which arm is faster.

    python -m bench.ab --base /tmp/base --new . --rounds 3          # runs 4 x rounds benchmarks
    python -m bench.ab --from /tmp/ab/out                           # summarise a finished run

Writes ``bench/results/ab_quick.json`` / ``.md``. The arms run with ``--no-peer`` (the peer is
unchanged code and doubles the time)."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import markdown_table, write_results

BENCHES = ("serve", "model")
Row = tuple[str, str, bool, Callable[[dict], float]]  # (label, bench, higher is better, value)


def _at(rows: list[dict], key: str, value: object, field: str) -> float:
    return float(next(r[field] for r in rows if r[key] == value))


ROWS: list[Row] = [
    (
        "decode ms/token @ 512 (model + cache)",
        "serve",
        False,
        lambda d: _at(d["decode"], "context", 512, "hybrid_ms"),
    ),
    (
        "decode ms/token @ 2048 (model + cache)",
        "serve",
        False,
        lambda d: _at(d["decode"], "context", 2048, "hybrid_ms"),
    ),
    (
        "engine decode ms/token @ 512 (scheduler + runner)",
        "serve",
        False,
        lambda d: d["engine_decode_ms_first_ctx"],
    ),
    (
        "engine prefill tok/s, chunk 128",
        "serve",
        True,
        lambda d: _at(d["prefill"], "chunk_size", 128, "tok_s"),
    ),
    (
        "engine prefill tok/s, chunk 512",
        "serve",
        True,
        lambda d: _at(d["prefill"], "chunk_size", 512, "tok_s"),
    ),
    (
        "engine prefill tok/s, chunk 2048",
        "serve",
        True,
        lambda d: _at(d["prefill"], "chunk_size", 2048, "tok_s"),
    ),
    (
        "engine throughput tok/s, 1 request",
        "serve",
        True,
        lambda d: _at(d["throughput"], "concurrent", 1, "tok_s"),
    ),
    (
        "engine throughput tok/s, 8 concurrent",
        "serve",
        True,
        lambda d: _at(d["throughput"], "concurrent", 8, "tok_s"),
    ),
    (
        "engine throughput tok/s, 32 concurrent",
        "serve",
        True,
        lambda d: _at(d["throughput"], "concurrent", 32, "tok_s"),
    ),
    ("engine ms/token, JSON schema", "serve", False, lambda d: d["structured"]["json_schema_ms"]),
    ("prefix reuse: time to first token s (on)", "serve", False, lambda d: d["prefix_reuse"]["on"]["ttft_s"]),
    ("prefix reuse: group of samples s (on)", "serve", False, lambda d: d["prefix_reuse"]["on"]["group_s"]),
    ("train tok/s, T 256", "model", True, lambda d: _at(d["train"], "T", 256, "ours_tok_s")),
    ("prefill tok/s, T 512", "model", True, lambda d: _at(d["prefill"], "T", 512, "ours_tok_s")),
    ("decode ms/token @ 256", "model", False, lambda d: _at(d["decode"], "context", 256, "ours_ms")),
    ("decode ms/token @ 2048", "model", False, lambda d: _at(d["decode"], "context", 2048, "ours_ms")),
]


def run(base: Path, new: Path, rounds: int, out: Path) -> None:
    """Alternate the arms: every round runs base then new, each bench in turn."""
    out.mkdir(parents=True, exist_ok=True)
    for rnd in range(1, rounds + 1):
        for arm, tree in (("base", base), ("new", new)):
            for b in BENCHES:
                t0 = time.time()
                env = {**os.environ, "PYTHONPATH": str(tree)}
                cmd = [sys.executable, "-m", f"bench.{b}", "--quick", "--no-peer", "--no-readme"]
                log = (out / f"{arm}_{b}_{rnd}.log").open("w")
                subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
                src = tree / "bench" / "results" / f"{b}_quick.json"
                (out / f"{arm}_{b}_{rnd}.json").write_text(src.read_text())
                load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
                with (out / "progress.txt").open("a") as f:
                    f.write(f"{arm} {b} {rnd} {time.time() - t0:.0f}s load {load}\n")


def summarise(out: Path) -> tuple[list[list[object]], dict]:
    rows, data = [], {}
    text = (out / "progress.txt").read_text() if (out / "progress.txt").exists() else ""
    loads = [float(m.group(1)) for m in re.finditer(r"\d+s (?:load )?([\d.]+)", text)]
    for label, b, higher, fn in ROWS:
        arms = {}
        for arm in ("base", "new"):
            files = sorted(out.glob(f"{arm}_{b}_*.json"))
            arms[arm] = [fn(json.loads(f.read_text())) for f in files]
        if not arms["base"] or not arms["new"]:
            continue
        mb, mn = statistics.median(arms["base"]), statistics.median(arms["new"])
        inside = min(arms["new"]) <= mb <= max(arms["new"]) and min(arms["base"]) <= mn <= max(arms["base"])
        better = mn > mb if higher else mn < mb
        verdict = "within noise" if inside else ("new faster" if better else "new slower")
        rows.append(
            [label, f"{mb:.4g} [{min(arms['base']):.4g}, {max(arms['base']):.4g}]",
             f"{mn:.4g} [{min(arms['new']):.4g}, {max(arms['new']):.4g}]", f"{mn / mb:.3f}", verdict]
        )  # fmt: skip
        data[label] = {**arms, "higher_is_better": higher, "verdict": verdict}
    return rows, {"rows": data, "rounds": len(sorted(out.glob("base_serve_*.json"))), "loadavg_1m": loads}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", type=Path, help="source tree of the 'before' arm")
    ap.add_argument("--new", type=Path, help="source tree of the 'after' arm")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    ap.add_argument("--out", type=Path, default=Path("runs/ab"), help="where the runs' JSON and logs go")
    ap.add_argument("--from", dest="src", type=Path, help="summarise this finished run instead of running")
    args = ap.parse_args()
    out = args.src or args.out
    if args.src is None:
        if args.base is None or args.new is None:
            ap.error("--base and --new (or --from)")
        run(args.base.resolve(), args.new.resolve(), args.rounds, out)
    rows, payload = summarise(out)
    loads = payload["loadavg_1m"]
    table = markdown_table(["measurement", "before: median [min, max]", "after", "after / before", ""], rows)
    table += (
        f"\n\n{payload['rounds']} alternating rounds (before, after) of `bench.serve --quick --no-peer` and "
        f"`bench.model --quick --no-peer` in one run; CPU, 1 thread; 1-minute load average during the run "
        f"{min(loads, default=0):.0f}-{max(loads, default=0):.0f} on 2 cores shared with other work (heavy "
        "contention: read ranges, not single numbers)."
    )
    print(table)
    write_results("ab_quick", payload, table, update_readme=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
