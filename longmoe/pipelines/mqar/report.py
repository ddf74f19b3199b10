"""The sweep's report: the sanity cell, the accuracy table (best lr per cell), the checks, plots.

Writes ``OUT/report.md``, ``OUT/results.json`` and ``OUT/plots/{acc_vs_pairs,acc_vs_length}.png``;
no training or evaluation happens here.
"""

from __future__ import annotations

import json
from pathlib import Path

from longmoe.pipelines.mqar.checks import answers, se
from longmoe.pipelines.mqar.config import SweepConfig
from longmoe.pipelines.mqar.result import RunResult, SweepResult
from longmoe.plotting import pyplot

REPORT_MD = "report.md"
RESULTS_JSON = "results.json"
PLOTS_DIR = "plots"


def label(r: RunResult) -> str:
    return r.cell.pattern + ("" if r.cell.position == "none" else f"+{r.cell.position}")


def table(rc: SweepConfig, best: list[RunResult]) -> str:
    """One row per cell (best lr): accuracy ± its standard error at each eval length."""
    lens = rc.eval_lengths
    head = "| pattern | d_model | pairs | seed | best lr | steps | KDA state | " + " | ".join(
        f"acc @ {n}" + (" (train)" if n == rc.train_len else "") for n in lens
    )
    rows = [head + " |", "|" + "---|" * (7 + len(lens))]
    for r in sorted(best, key=lambda r: (r.cell.n_pairs, r.cell.d_model, label(r), r.cell.seed)):
        k = answers(rc, r.cell.n_pairs)
        accs = " | ".join(f"{r.acc(n):.3f} ± {se(r.acc(n), k):.3f}" for n in lens)
        rows.append(
            f"| {label(r)} | {r.cell.d_model} | {r.cell.n_pairs} | {r.cell.seed} | {r.cell.lr:g} | "
            f"{r.steps}{'' if r.solved else ' (budget)'} | {r.kda_state:,} | {accs} |"
        )
    return "\n".join(rows)


def render_report(rc: SweepConfig, res: SweepResult) -> str:
    lines = ["# MQAR sweep: associative recall vs state capacity", ""]
    if res.sanity is not None:
        s = res.sanity
        lines += [
            f"Sanity cell {s.cell.key}: {'solved' if s.solved else 'NOT solved'} in {s.steps} steps "
            f"(accuracy {s.acc(rc.train_len):.3f} at the training length).",
            "",
        ]
    lines += [
        f"Training: {rc.train_len} tokens, vocab {rc.vocab_size}, alpha {rc.alpha}, batch {rc.batch_size}, "
        f"at most {rc.steps} steps (early stop at {rc.target_accuracy}), lrs {rc.lrs}; the best lr per cell "
        f"is kept. Accuracy: held-out rows ({rc.eval_n} per length), answers only, ± one standard error.",
        "",
        table(rc, res.best),
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
    render_plots(rc, res.best, out / PLOTS_DIR)
    md = render_report(rc, res)
    (out / REPORT_MD).write_text(md)
    (out / RESULTS_JSON).write_text(json.dumps(res.to_dict(), indent=2) + "\n")
    return md
