"""Structured extraction scoring: a model's JSON answer against a document's ground truth.

Both sides are flattened to ``path -> value`` pairs (``items.0.price -> "12.50"``; a leaf's value is
its canonical JSON text, so ``3`` and ``"3"`` differ). A predicted pair is a true positive when the
truth has the same path with the same value. Per item: JSON validity (the answer parses as a JSON
object, after stripping a Markdown code fence and any text before the first ``{`` or after the
object), exact match (canonical JSON equal), field precision, recall and F1 (an invalid answer has no
pairs: precision 0 by convention, recall 0). Per family: the means of the per-item numbers with their
standard errors, micro (pooled) precision/recall/F1 with jackknife standard errors over items, and a
95% interval of the micro F1 (``intervals.f1_interval``: a page bootstrap, widened by a Clopper-Pearson
bound when every page is all right or all wrong, so F1 1.000 never reads as ``± 0``).

The run (``run_extract``) scores held-out renders of each family with any backend that has
``extract(docs, max_tokens) -> list[Reply]``, appends one JSON line per document to
``OUT/extract_results.jsonl`` (a rerun skips the ids already there) and writes
``OUT/extract_summary.{json,md}``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longmoe.eval.extract.intervals import f1_interval
from longmoe.runlog import read_jsonl
from longmoe.tasks.documents import Document, canonical_json, held_out_seeds, render

RESULTS_FILE = "extract_results.jsonl"
SUMMARY_JSON = "extract_summary.json"
SUMMARY_MD = "extract_summary.md"
ITEM_METRICS = ("valid", "exact", "precision", "recall", "f1")
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```\s*$")


# ---------------------------------------------------------------------- pure metrics
def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": [1, "x"]}}`` -> ``{"a.b.0": "1", "a.b.1": '"x"'}``; an empty object or list
    is a leaf of its own (``"{}"``, ``"[]"``) so that it still counts as a field."""
    if isinstance(obj, dict) and obj:
        out: dict[str, str] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(obj, list) and obj:
        out = {}
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}.{i}" if prefix else str(i)))
        return out
    return {prefix: canonical_json(obj)}


def parse_answer(text: str) -> dict[str, Any] | None:
    """The JSON object in a model's answer, or None: leading prose, a code fence and trailing text
    after the object are tolerated; anything else that is not one JSON object is invalid."""
    s = _FENCE.sub("", text.strip())
    start = s.find("{")
    if start < 0:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(s, start)
    except json.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def score_fields(pred: dict[str, Any] | None, gold: dict[str, Any]) -> dict[str, float]:
    """Per-item validity, exact match, and field precision/recall/F1 (plus the counts behind them)."""
    g = flatten(gold)
    p = flatten(pred) if pred is not None else {}
    tp = sum(1 for k, v in p.items() if g.get(k) == v)
    precision = tp / len(p) if p else 0.0
    recall = tp / len(g) if g else float(not p)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {
        "valid": float(pred is not None),
        "exact": float(pred is not None and canonical_json(pred) == canonical_json(gold)),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "tp": tp,
        "n_pred": len(p),
        "n_gold": len(g),
    }


def score_answer(text: str, gold: dict[str, Any]) -> dict[str, float]:
    return score_fields(parse_answer(text), gold)


def _mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan")
    m = sum(xs) / n
    if n < 2:
        return m, float("nan")
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def _prf(tp: float, n_pred: float, n_gold: float) -> tuple[float, float, float]:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r > 0 else 0.0)


def micro_prf(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Pooled precision/recall/F1 over items, each with a jackknife (leave-one-item-out) standard error."""
    tp, npred, ngold = (sum(float(r[k]) for r in rows) for k in ("tp", "n_pred", "n_gold"))
    full = _prf(tp, npred, ngold)
    n = len(rows)
    out = dict(zip(("micro_precision", "micro_recall", "micro_f1"), full))
    for j, name in enumerate(("micro_precision", "micro_recall", "micro_f1")):
        if n < 2:
            out[f"{name}_se"] = float("nan")
            continue
        loo = [_prf(tp - r["tp"], npred - r["n_pred"], ngold - r["n_gold"])[j] for r in rows]
        m = sum(loo) / n
        out[f"{name}_se"] = math.sqrt((n - 1) / n * sum((x - m) ** 2 for x in loo))
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family (and ``all``): n, mean ± standard error of each item metric, micro P/R/F1 ± SE."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["family"]].append(r)
    if len(groups) > 1:
        groups["all"] = list(rows)
    out = {}
    for fam, rs in groups.items():
        cell: dict[str, Any] = {"n": len(rs)}
        for m in ITEM_METRICS:
            cell[m], cell[f"{m}_se"] = _mean_se([float(r[m]) for r in rs])
        cell.update(micro_prf(rs))
        cell.update(f1_interval(rs))
        out[fam] = cell
    return {"families": out, "n_items": len(rows)}


def _pm(m: float, se: float) -> str:
    return f"{m:.3f}" if math.isnan(se) else f"{m:.3f} ± {se:.3f}"


def f1_with_interval(c: dict[str, Any]) -> str:
    """``0.953 [0.931, 0.972]``: a summary cell's micro F1 and its 95% interval (older cells: ± SE)."""
    if "micro_f1_lo" not in c or math.isnan(c["micro_f1_lo"]):
        return _pm(c["micro_f1"], c.get("micro_f1_se", float("nan")))
    return f"{c['micro_f1']:.3f} [{c['micro_f1_lo']:.3f}, {c['micro_f1_hi']:.3f}]"


def markdown_summary(summary: dict[str, Any]) -> str:
    """One row per family: n, field F1 (micro, pooled) with its 95% interval, per-item mean F1, exact
    match, valid JSON."""
    lines = [
        "| family | n | field F1 (micro) [95% CI] | precision | recall | item F1 | exact | valid JSON |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for fam, c in summary["families"].items():
        lines.append(
            f"| {fam} | {c['n']} | {f1_with_interval(c)} | "
            f"{_pm(c['micro_precision'], c['micro_precision_se'])} | "
            f"{_pm(c['micro_recall'], c['micro_recall_se'])} | {_pm(c['f1'], c['f1_se'])} | "
            f"{_pm(c['exact'], c['exact_se'])} | {_pm(c['valid'], c['valid_se'])} |"
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- the run
def max_new_tokens(doc: Document, count: Callable[[str], int], slack: float = 1.5) -> int:
    """Room for the answer: ``slack`` times the truth's token count plus a few tokens."""
    return int(slack * count(doc.target)) + 8


def run_extract(
    client: Any,
    families: list[str],
    n: int,
    out_dir: str | Path,
    offset: int = 0,
    batch_size: int = 8,
    max_tokens: int | None = None,
    count_tokens: Callable[[str], int] = len,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Score ``n`` held-out renders per family (seeds ``held_out_seeds(n, offset)``), resumably.

    ``count_tokens`` sizes each answer's budget (the model's tokenizer; ``len`` counts characters,
    an upper bound for any byte-level tokenizer) unless ``max_tokens`` is given.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS_FILE
    done = {r.get("id") for r in read_jsonl(path)}
    todo = [(f, s) for f in families for s in held_out_seeds(n, offset) if f"{f}:{s}" not in done]
    if len(done):
        log(f"resuming: {len(done)} documents already scored in {path}")
    with path.open("a", encoding="utf-8") as fh:
        for i in range(0, len(todo), max(1, batch_size)):
            docs = [render(f, s) for f, s in todo[i : i + max(1, batch_size)]]
            budgets = [max_tokens or max_new_tokens(d, count_tokens) for d in docs]
            t0 = time.perf_counter()
            replies = client.extract(docs, budgets)
            dt = (time.perf_counter() - t0) / len(docs)
            for d, rep in zip(docs, replies):
                row = {
                    "id": d.doc_id,
                    "family": d.family,
                    "seed": d.seed,
                    "target": d.target,
                    "prediction": rep.text,
                    **score_answer(rep.text, d.fields),
                    "prompt_tokens": rep.prompt_tokens,
                    "latency_s": round(dt, 4),
                    "model": getattr(client, "name", None),
                }
                fh.write(json.dumps(row) + "\n")
            fh.flush()
            log(f"extract: {min(i + batch_size, len(todo))}/{len(todo)} documents scored")
    return write_summary(out, families)


def write_summary(out_dir: str | Path, families: list[str] | None = None) -> dict[str, Any]:
    """Recompute the summary from ``OUT/extract_results.jsonl`` (only ``families`` when given)."""
    out = Path(out_dir)
    rows = [r for r in read_jsonl(out / RESULTS_FILE) if families is None or r["family"] in families]
    summary = summarize(rows)
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=2) + "\n")
    (out / SUMMARY_MD).write_text(markdown_summary(summary) if rows else "no results\n")
    return summary
