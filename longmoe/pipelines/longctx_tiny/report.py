"""The ablation's ``report.md``, ``results.json`` and comparison plots, from a ``RecipeResult``."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

from longmoe.eval.plots import accuracy_vs_length, ppl_curve
from longmoe.pipelines.longctx_tiny.checks import fmt
from longmoe.pipelines.longctx_tiny.result import RecipeResult

REPORT_MD = "report.md"
RESULTS_JSON = "results.json"
PLOTS_DIR = "plots"


def _header(r: RecipeResult) -> list[str]:
    rc = r.config
    return [
        f"# longctx_tiny: layer patterns {', '.join(r.patterns)}",
        "",
        f"Preset `{rc.preset}`, trained on {rc.tokens:,} tokens in windows of {rc.window} "
        f"(synthetic share {rc.synthetic_share} of {'+'.join(rc.synthetic_tasks)}, "
        f"synthetic documents {rc.synthetic_length[0]}-"
        f"{rc.synthetic_length[1]} x window"
        + (
            f", after a first {rc.short_docs_fraction:.0%} of the tokens with documents of "
            f"{rc.short_docs_length[0]}-{rc.short_docs_length[1]} x window"
            if rc.short_docs_fraction > 0
            else ""
        )
        + f"), evaluated at {', '.join(str(n) for n in rc.eval_lengths)} tokens, "
        f"{rc.eval_depths} depths, {rc.eval_n} items per cell. Accuracy = all answers contained (RULER).",
    ]


def _training(r: RecipeResult) -> list[str]:
    lines = ["| pattern | params | tokens | train loss (last 10) | val loss |", "|---|---|---|---|---|"]
    for p in r.patterns:
        t = r.trained[p]
        lines.append(
            f"| {p} | {t.params:,} | {t.tokens:,} | {fmt(t.train_loss_last10, 3)} | {fmt(t.val_loss, 3)} |"
        )
    return lines


def _by_length_table(r: RecipeResult, cell: dict[str, dict[tuple[str, int], str]]) -> list[str]:
    """A pattern x task table with one column per eval length; ``cell[p][(task, n)]`` is the text."""
    W, lengths = r.config.window, r.config.eval_lengths
    lines = ["| pattern | task | " + " | ".join(f"{n // W}x ({n})" for n in lengths) + " |"]
    lines.append("|---|---|" + "---|" * len(lengths))
    for task in r.config.eval_tasks:
        for p in r.patterns:
            lines.append(f"| {p} | {task} | " + " | ".join(cell[p][(task, n)] for n in lengths) + " |")
    return lines


def _accuracy(r: RecipeResult) -> list[str]:
    grid = [(t, n) for t in r.config.eval_tasks for n in r.config.eval_lengths]
    acc = {p: {k: fmt(r.evals[p].accuracy(*k)) for k in grid} for p in r.patterns}
    lines = ["Accuracy by task and length (x training window)", "", *_by_length_table(r, acc)]
    variants = sorted(set().union(*(r.evals[p].variants() for p in r.patterns)))
    lines += ["", "Accuracy by variant (all lengths pooled; items per pattern in brackets)", ""]
    lines.append("| variant | " + " | ".join(r.patterns) + " |")
    lines.append("|---|" + "---|" * len(r.patterns))
    for t, v in variants:
        cells = [r.evals[p].variant_accuracy(t, v, r.config.eval_lengths) for p in r.patterns]
        lines.append(f"| {t}_{v} | " + " | ".join(f"{fmt(a)} ({n})" for a, n in cells) + " |")
    return lines


def _answer_loss(r: RecipeResult) -> list[str]:
    nll = {}
    for p in r.patterns:
        measured = {(a.task, a.length): a.answer_nll for a in r.evals[p].answer_nll if a.variant == "*"}
        nll[p] = {
            (t, n): fmt(measured.get((t, n)), 3) for t in r.config.eval_tasks for n in r.config.eval_lengths
        }
    return [
        "Answer loss (teacher-forced mean next-token loss of the answer given the prompt; lower = better)",
        "",
        *_by_length_table(r, nll),
    ]


def _position_loss(r: RecipeResult) -> list[str]:
    lines = [
        "Loss by position (validation files, up to the largest eval length)",
        "",
        "| pattern | loss inside window | loss at end of window | loss beyond | beyond / end |",
        "|---|---|---|---|---|",
    ]
    for p in r.patterns:
        x = r.evals[p].ppl
        lines.append(
            f"| {p} | {fmt(x['inside'], 3)} | {fmt(x['end_of_window'], 3)} | {fmt(x['beyond'], 3)} "
            f"| {fmt(x['beyond_over_end'], 3)} |"
        )
    return lines


def _generations(r: RecipeResult) -> list[str]:
    lines = [
        "What the models generate (greedy, first line after `Answer:`)",
        "",
        "| pattern | items | empty answers | most common answer |",
        "|---|---|---|---|",
    ]
    for p in r.patterns:
        preds = r.evals[p].predictions
        common = Counter(preds).most_common(1)[0] if preds else ("", 0)
        lines.append(
            f"| {p} | {len(preds)} | {sum(not x for x in preds)} | `{common[0][:40]}` ({common[1]}) |"
        )
    return lines


def render_report(r: RecipeResult) -> str:
    """The Markdown report: training, accuracy, answer loss, loss by position, answers, checks."""
    sections = [_header(r), _training(r), _accuracy(r), _answer_loss(r), _position_loss(r), _generations(r)]
    sections.append(
        ["Expected outcomes, checked against the numbers above", ""]
        + [f"- {c.claim}: **{c.verdict}** ({c.evidence})" for c in r.checks]
    )
    return "\n\n".join("\n".join(s) for s in sections) + "\n"


def render_plots(r: RecipeResult, plots: Path) -> list[Path]:
    """Accuracy and answer loss against length, and loss by position, one line per pattern."""
    W, pats = r.config.window, r.patterns
    by_length = {p: {"by_length": r.evals[p].by_length} for p in pats}
    written = [accuracy_vs_length(by_length, plots / "accuracy_vs_length.png", window=W)]
    nll_rows = {  # the graded view: answer loss per task and length, where accuracies are all zero
        p: {"by_length": [dataclasses.asdict(a) for a in r.evals[p].answer_nll if a.variant == "*"]}
        for p in pats
    }
    if all(v["by_length"] for v in nll_rows.values()):
        written.append(
            accuracy_vs_length(
                nll_rows,
                plots / "answer_loss_vs_length.png",
                metric="answer_nll",
                window=W,
                ylim=None,
                ylabel="answer loss (nats/token)",
            )
        )
    written.append(ppl_curve({p: r.evals[p].ppl for p in pats}, plots / "ppl_by_position.png"))
    return written


def write_report(r: RecipeResult, out: Path) -> str:
    """``OUT/report.md``, ``OUT/results.json`` and ``OUT/plots/``; returns the Markdown."""
    render_plots(r, out / PLOTS_DIR)
    report = render_report(r)
    (out / REPORT_MD).write_text(report)
    (out / RESULTS_JSON).write_text(json.dumps(r.to_dict(), indent=2) + "\n")
    return report
