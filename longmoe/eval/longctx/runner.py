"""The evaluation grid: tasks x lengths x depths, scored, written as JSON lines, resumable.

``OUT/results.jsonl`` gets one line per scored item (``id``, task, variant, length, depth, answers,
prediction, the metrics of ``scoring.METRICS``, latency). A rerun with the same ``OUT`` skips every
id already there, so an interrupted run continues where it stopped. ``OUT/summary.json`` and
``OUT/summary.md`` aggregate all lines of the file (mean per task x length x depth).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from longmoe.data.tokenizer import Tokenizer
from longmoe.eval.scoring import METRICS, score
from longmoe.runlog import read_jsonl
from longmoe.tasks import TaskError, TaskItem, generate, parse_tasks

RESULTS_FILE = "results.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


def parse_lengths(spec: str | Iterable[int]) -> list[int]:
    """``"1k,4k,16384"`` -> ``[1024, 4096, 16384]`` (k = 1024, m = 1024**2)."""
    if not isinstance(spec, str):
        return [int(x) for x in spec]
    out = []
    for part in (p.strip().lower() for p in spec.split(",")):
        if not part:
            continue
        mult = {"k": 1024, "m": 1024**2}.get(part[-1], 1)
        num = part[:-1] if mult > 1 else part
        try:
            n = int(float(num) * mult)
        except ValueError:
            raise TaskError(f"--lengths item {part!r} is invalid: expected e.g. 512, 1k, 4k, 16k") from None
        if n < 32:
            raise TaskError(f"--lengths item {part!r} is invalid: expected at least 32 tokens")
        out.append(n)
    if not out:
        raise TaskError("--lengths is empty: expected e.g. 1k,4k")
    return out


def parse_depths(spec: str | int | Iterable[float]) -> list[float]:
    """``5`` -> 5 evenly spaced depths 0, .25, .5, .75, 1; ``"0.1,0.9"`` -> those depths."""
    if isinstance(spec, int):
        spec = str(spec)
    if not isinstance(spec, str):
        return [float(x) for x in spec]
    s = spec.strip()
    if "," not in s and "." not in s:
        try:
            k = int(s)
        except ValueError:
            raise TaskError(
                f"--depths {spec!r} is invalid: expected a count or a list like 0,0.5,1"
            ) from None
        if k < 1:
            raise TaskError(f"--depths {spec!r} is invalid: expected a count >= 1")
        return [0.5] if k == 1 else [round(i / (k - 1), 4) for i in range(k)]
    try:
        out = [float(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise TaskError(f"--depths {spec!r} is invalid: expected numbers in [0, 1]") from None
    if not out or any(not 0 <= d <= 1 for d in out):
        raise TaskError(f"--depths {spec!r} is invalid: expected numbers in [0, 1]")
    return out


@dataclass
class GridItem:
    id: str
    task: str
    length: int
    depth: float
    item: TaskItem


def item_id(task: str, length: int, depth: float, seed: int, index: int) -> str:
    return f"{task}|{length}|{depth:g}|{seed}|{index}"


def build_grid(
    tasks: list[str], lengths: list[int], depths: list[float], n: int, seed: int, tokenizer: Tokenizer
) -> list[GridItem]:
    """All items of the grid; cell (task, length, depth) uses seed ``seed`` with items 0..n-1."""
    out = []
    for task in parse_tasks(tasks):
        for length in lengths:
            for depth in depths:
                for i, it in enumerate(generate(task, n, length, seed, tokenizer, depth=depth)):
                    out.append(GridItem(item_id(task, length, depth, seed, i), task, length, depth, it))
    return out


def max_new_tokens(item: TaskItem, tokenizer: Tokenizer, cap: int | None = None) -> int:
    """Room for the answer: twice its token count plus slack (a separator, a trailing newline)."""
    n = 2 * len(tokenizer.encode(" " + item.answer_text())) + 8
    return min(n, cap) if cap else n


def run_grid(
    client: Any,
    grid: list[GridItem],
    out_dir: str | Path,
    tokenizer: Tokenizer,
    limit: int | None = None,
    max_tokens: int | None = None,
    batch_size: int = 8,
    progress: bool = True,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Score the items of ``grid`` not yet in ``OUT/results.jsonl`` (at most ``limit`` of them).

    Items go to the client ``batch_size`` at a time when it has ``complete_batch`` (the local engine
    decodes them together); each batch is appended to the file as soon as it is scored.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS_FILE
    done = {r.get("id") for r in read_jsonl(path)}
    todo = [g for g in grid if g.id not in done]
    skipped = len(grid) - len(todo)
    if limit is not None:
        todo = todo[: max(0, limit)]
    if skipped:
        log(f"resuming: {skipped} of {len(grid)} items already scored in {path}")
    bar = tqdm(total=len(todo), desc="eval", unit="item", disable=not progress, dynamic_ncols=True)
    rows: list[dict[str, Any]] = []
    with path.open("a", encoding="utf-8") as fh:
        for s in range(0, len(todo), max(1, batch_size)):
            batch = todo[s : s + max(1, batch_size)]
            prompts = [g.item.prompt() for g in batch]
            budgets = [max_new_tokens(g.item, tokenizer, max_tokens) for g in batch]
            t0 = time.perf_counter()
            if hasattr(
                client, "complete_item"
            ):  # the context as an uploaded file, the question asked about it
                replies = [
                    client.complete_item(g.item.context, g.item.question, m) for g, m in zip(batch, budgets)
                ]
            elif hasattr(client, "complete_batch"):
                replies = client.complete_batch(prompts, budgets)
            else:
                replies = [client.complete(p, m) for p, m in zip(prompts, budgets)]
            dt = (time.perf_counter() - t0) / len(batch)
            for g, reply in zip(batch, replies):
                row = _row(g, reply, dt, getattr(client, "name", None))
                fh.write(json.dumps(row) + "\n")
                rows.append(row)
            fh.flush()
            bar.update(len(batch))
            bar.set_postfix(
                task=batch[-1].task, length=batch[-1].length, acc=f"{_mean([r['all'] for r in rows]):.2f}"
            )
    bar.close()
    return rows


def _row(g: GridItem, reply: Any, latency: float, model: str | None) -> dict[str, Any]:
    m = g.item.metadata
    return {
        "id": g.id,
        "task": g.task,
        "variant": m.get("variant"),
        "length": g.length,
        "depth": g.depth,
        "index": m.get("index"),
        "n_tokens": m.get("n_tokens"),
        "prompt_tokens": reply.prompt_tokens,
        "hops": m.get("hops"),
        "n_conflicts": m.get("n_conflicts"),
        "answers": g.item.answers,
        "prediction": reply.text,
        **score(reply.text, g.item.answers),
        "latency_s": round(latency, 4),
        "model": model,
    }


# ---------------------------------------------------------------------- summaries
def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _sort_key(k: tuple) -> tuple:
    return tuple((0, x, "") if isinstance(x, (int, float)) else (1, 0, str(x)) for x in k)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of every metric per (task, length, depth), per (task, length), per (task, variant, length)."""
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    by_len: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    by_var: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        cells[(r["task"], r["length"], r["depth"])].append(r)
        by_len[(r["task"], r["length"])].append(r)
        by_var[(r["task"], r["variant"], r["length"])].append(r)

    def agg(keys: tuple[str, ...], groups: dict[tuple, list[dict[str, Any]]]) -> list[dict[str, Any]]:
        return [
            {**dict(zip(keys, k)), "n": len(v), **{m: _mean([float(r[m]) for r in v]) for m in METRICS}}
            for k, v in sorted(groups.items(), key=lambda kv: _sort_key(kv[0]))
        ]

    return {
        "cells": agg(("task", "length", "depth"), cells),
        "by_length": agg(("task", "length"), by_len),
        "by_variant": agg(("task", "variant", "length"), by_var),
        "n_items": len(rows),
    }


def markdown_summary(summary: dict[str, Any], metric: str = "all") -> str:
    """Task x length table (mean ``metric``), then one task x depth table per length."""
    by_len = summary["by_length"]
    tasks = sorted({r["task"] for r in by_len})
    lengths = sorted({r["length"] for r in by_len})
    val = {(r["task"], r["length"]): r for r in by_len}
    lines = [f"Accuracy ({metric}: {_METRIC_HELP[metric]}), mean over depths and items", ""]
    lines.append("| task | " + " | ".join(_fmt_len(n) for n in lengths) + " |")
    lines.append("|---|" + "---|" * len(lengths))
    for t in tasks:
        cells = [
            f"{val[(t, n)][metric]:.2f} (n={val[(t, n)]['n']})" if (t, n) in val else "-" for n in lengths
        ]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    var = summary["by_variant"]
    if len({(r["task"], r["variant"]) for r in var}) > len(tasks):
        vkeys = sorted({(r["task"], r["variant"]) for r in var})
        vval = {(r["task"], r["variant"], r["length"]): r[metric] for r in var}
        lines += [
            "",
            "By variant",
            "",
            "| task | variant | " + " | ".join(_fmt_len(n) for n in lengths) + " |",
        ]
        lines.append("|---|---|" + "---|" * len(lengths))
        for t, v in vkeys:
            cells = [f"{vval[(t, v, n)]:.2f}" if (t, v, n) in vval else "-" for n in lengths]
            lines.append(f"| {t} | {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


_METRIC_HELP = {
    "exact": "exact set match",
    "all": "all answers contained, RULER",
    "part": "share of answers contained",
}


def _fmt_len(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def write_summary(out_dir: str | Path) -> dict[str, Any]:
    """Recompute the summary from all of ``OUT/results.jsonl`` and write the JSON and markdown forms."""
    out = Path(out_dir)
    rows = read_jsonl(out / RESULTS_FILE)
    summary = summarize(rows)
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
    (out / SUMMARY_MD).write_text(markdown_summary(summary) if rows else "no results\n")
    return summary
