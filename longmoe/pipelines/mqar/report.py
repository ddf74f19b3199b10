"""The sweep's report: the sanity cell, the accuracy table (lr chosen on validation rows, accuracy on
test rows) with its baselines beside every number (chance ``1/P``; the NoPE-attention-only ``M`` row),
the mean over seeds, the query-distance distribution per eval length, the checks, plots.

Writes ``OUT/report.md``, ``OUT/results.json`` and ``OUT/plots/{acc_vs_pairs,acc_vs_length}.png``;
no training or evaluation happens here (the distance table only draws test rows).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from longmoe.pipelines.mqar.checks import answers, chance, se
from longmoe.pipelines.mqar.config import SweepConfig
from longmoe.pipelines.mqar.result import RunResult, SweepResult
from longmoe.pipelines.mqar.seeds import test_seed
from longmoe.report.plotting import pyplot
from longmoe.tasks.mqar import max_distance, mqar

REPORT_MD = "report.md"
RESULTS_JSON = "results.json"
PLOTS_DIR = "plots"


def label(r: RunResult) -> str:
    return r.cell.pattern + ("" if r.cell.position == "none" else f"+{r.cell.position}")


def nope_baseline(best: list[RunResult]) -> dict[tuple[int, int], dict[str, float]]:
    """The NoPE-attention-only model (pattern ``M``, no position control): per (d_model, pairs), its
    mean test accuracy over seeds by eval length."""
    rs: dict[tuple[int, int], list[RunResult]] = {}
    for r in best:
        if r.cell.pattern == "M" and r.cell.position == "none":
            rs.setdefault((r.cell.d_model, r.cell.n_pairs), []).append(r)
    return {k: {n: sum(r.accuracy[n] for r in v) / len(v) for n in v[0].accuracy} for k, v in rs.items()}


def _baseline(base: dict[str, float], n: int) -> str:
    return f" [{base[str(n)]:.3f}]" if str(n) in base else " [–]"


def table(rc: SweepConfig, best: list[RunResult]) -> str:
    """One row per cell and seed (lr chosen on validation): test accuracy ± its standard error at each
    eval length, beside chance (``1/P``) and the NoPE-attention-only ``M`` row's accuracy."""
    lens, nope = rc.eval_lengths, nope_baseline(best)
    head = "| pattern | d_model | pairs | seed | best lr | steps | KDA state | chance 1/P | " + " | ".join(
        f"acc @ {n}" + (" (train)" if n == rc.train_len else "") + " [M]" for n in lens
    )
    rows = [head + " |", "|" + "---|" * (8 + len(lens))]
    for r in sorted(best, key=lambda r: (r.cell.n_pairs, r.cell.d_model, label(r), r.cell.seed)):
        k, base = answers(rc, r.cell.n_pairs), nope.get((r.cell.d_model, r.cell.n_pairs), {})
        accs = " | ".join(f"{r.acc(n):.3f} ± {se(r.acc(n), k):.3f}{_baseline(base, n)}" for n in lens)
        rows.append(
            f"| {label(r)} | {r.cell.d_model} | {r.cell.n_pairs} | {r.cell.seed} | {r.cell.lr:g} | "
            f"{r.steps}{'' if r.solved else ' (budget)'} | {r.kda_state:,} | {chance(r.cell.n_pairs):.3f} | "
            f"{accs} |"
        )
    return "\n".join(rows)


def mean_se(values: list[float]) -> str:
    """``mean ± standard error of the mean`` (just the mean for one value)."""
    mu = sum(values) / len(values)
    if len(values) < 2:
        return f"{mu:.3f}"
    sd = math.sqrt(sum((x - mu) ** 2 for x in values) / (len(values) - 1))
    return f"{mu:.3f} ± {sd / math.sqrt(len(values)):.3f}"


def seed_table(rc: SweepConfig, best: list[RunResult]) -> str:
    """Per cell, the mean test accuracy over its seeds ± the standard error of that mean (the seed
    noise; with one seed only the binomial one of the rows above)."""
    cells: dict[tuple[int, int, str], list[RunResult]] = {}
    for r in best:
        cells.setdefault((r.cell.n_pairs, r.cell.d_model, label(r)), []).append(r)
    lens = rc.eval_lengths
    head = "| pattern | d_model | pairs | seeds | chance 1/P | " + " | ".join(f"mean acc @ {n}" for n in lens)
    rows = [head + " |", "|" + "---|" * (5 + len(lens))]
    for (p, d, lab), rs in sorted(cells.items()):
        accs = " | ".join(mean_se([r.acc(n) for r in rs]) for n in lens)
        rows.append(f"| {lab} | {d} | {p} | {len(rs)} | {chance(p):.3f} | {accs} |")
    return "\n".join(rows)


def _quantile(d: torch.Tensor, f: float) -> int:
    """The ``f`` quantile of the sorted 1-D ``d`` (nearest rank)."""
    return int(d[min(len(d) - 1, int(f * len(d)))])


def distances(rc: SweepConfig) -> list[dict[str, Any]]:
    """Per pair count and eval length, the key-to-query distances of the test rows, and the share that
    lies beyond the longest distance a training row (``rc.train_len`` tokens) can hold."""
    out = []
    for p in rc.pairs:
        limit = max_distance(rc.train_len, p)
        for n in rc.eval_lengths:
            d = mqar(test_seed(n), rc.eval_n, rc.vocab_size, n, p, rc.alpha).distance.flatten().sort().values
            out.append({
                "pairs": p, "length": n, "train_max": limit, "median": _quantile(d, 0.5),
                "p90": _quantile(d, 0.9), "max": int(d[-1]),
                "beyond_train": round(float((d > limit).float().mean()), 4),
            })  # fmt: skip
    return out


def distance_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| pairs | eval length | median distance | 90th pct | max | longest at training length "
             "| share of queries beyond it |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['pairs']} | {r['length']} | {r['median']} | {r['p90']} | {r['max']} | "
                     f"{r['train_max']} | {100 * r['beyond_train']:.1f}% |")  # fmt: skip
    return "\n".join(lines)


def render_report(rc: SweepConfig, res: SweepResult) -> str:
    lines = ["# MQAR sweep: associative recall vs state capacity", ""]
    if res.sanity is not None:
        s = res.sanity
        lines += [
            f"Sanity cell {s.cell.key}: {'solved' if s.solved else 'NOT solved'} in {s.steps} steps "
            f"(accuracy {s.acc(rc.train_len):.3f} at the training length).",
            "",
        ]
    legacy = sum(r.legacy for r in res.best)
    if legacy:
        lines += [
            f"**{legacy} of {len(res.best)} runs predate the test-row protocol**: their accuracy was "
            "measured on the validation rows that also chose their lr and early stop (an optimistic "
            "number). Rerun the sweep to replace them.",
            "",
        ]
    lines += [
        f"Training: {rc.train_len} tokens, vocab {rc.vocab_size}, alpha {rc.alpha}, batch {rc.batch_size}, "
        f"at most {rc.steps} steps (early stop at {rc.target_accuracy} on the validation rows), lrs "
        f"{rc.lrs} each run, seeds {rc.seeds}; per cell the lr with the best mean validation accuracy over "
        f"seeds is kept. Accuracy: test rows ({rc.eval_n} per length, seeds no selection step used), "
        "answers only, ± one binomial standard error; chance is 1/P (a guess among the row's values); "
        "[M]: the NoPE-attention-only model at the same width and pairs.",
        "",
        table(rc, res.best),
        "",
        "Mean over seeds (± standard error over seeds):",
        "",
        seed_table(rc, res.best),
        "",
        "## How far the queries are",
        "",
        "Key-to-query distances of the test rows at each eval length; the share beyond the longest "
        "distance a training-length row can hold is what extrapolation is tested on.",
        "",
        distance_table(res.distances),
        "",
        "## Expectations",
        "",
        "| expectation | verdict | evidence |",
        "|---|---|---|",
    ]
    lines += [f"| {c.claim} | {c.verdict} | {c.evidence} |" for c in res.checks]
    lines += ["", f"![accuracy vs pairs]({PLOTS_DIR}/acc_vs_pairs.png)", "",
              f"![accuracy vs length]({PLOTS_DIR}/acc_vs_length.png)", ""]  # fmt: skip
    return "\n".join(lines)


def _mean_by(best: list[RunResult], key, value) -> dict[str, dict[int, float]]:  # noqa: ANN001
    """Per label, the mean of ``value(r)`` over seeds (and widths) at each ``key(r)``."""
    acc: dict[str, dict[int, list[float]]] = {}
    for r in best:
        acc.setdefault(label(r), {}).setdefault(key(r), []).append(value(r))
    return {lab: {k: sum(v) / len(v) for k, v in sorted(d.items())} for lab, d in acc.items()}


def render_plots(rc: SweepConfig, best: list[RunResult], out: Path) -> list[Path]:
    """Accuracy vs pairs (at the training length) and vs length (largest pair count), per pattern."""
    out.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for lab, pts in _mean_by(best, lambda r: r.cell.n_pairs, lambda r: r.acc(rc.train_len)).items():
        ax.plot(list(pts), list(pts.values()), marker="o", label=lab)
    ax.set(xlabel="key-value pairs", ylabel=f"accuracy @ {rc.train_len} tokens", ylim=(-0.02, 1.02))
    ax.set_xscale("log", base=2)
    ax.axhline(rc.target_accuracy, color="grey", lw=0.5, ls="--")
    ax.legend(fontsize=8)
    ax.set_title("MQAR recall vs pairs (best lr per cell)")
    fig.tight_layout()
    f1 = out / "acc_vs_pairs.png"
    fig.savefig(f1, dpi=120)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(rc.pairs), figsize=(3.6 * len(rc.pairs), 3.6), squeeze=False)
    for ax, p in zip(axes[0], rc.pairs):
        rs = [r for r in best if r.cell.n_pairs == p]
        for lab in sorted({label(r) for r in rs}):
            mine = [r for r in rs if label(r) == lab]
            ys = [sum(r.acc(n) for r in mine) / len(mine) for n in rc.eval_lengths]
            ax.plot(rc.eval_lengths, ys, marker="o", label=lab)
        ax.set(title=f"{p} pairs", xlabel="eval length (tokens)", ylim=(-0.02, 1.02))
        ax.set_xscale("log", base=2)
        ax.axvline(rc.train_len, color="grey", lw=0.5, ls="--")
    axes[0][0].set_ylabel("accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="lower left")
    fig.tight_layout()
    f2 = out / "acc_vs_length.png"
    fig.savefig(f2, dpi=120)
    plt.close(fig)
    return [f1, f2]


def write_report(res: SweepResult, rc: SweepConfig, out: Path) -> str:
    if not res.distances:
        res.distances = distances(rc)
    render_plots(rc, res.best, out / PLOTS_DIR)
    md = render_report(rc, res)
    (out / REPORT_MD).write_text(md)
    (out / RESULTS_JSON).write_text(json.dumps(res.to_dict(), indent=2) + "\n")
    return md
