"""The demo's ``report.md`` (and the evaluation table pasted into the README), from a ``DemoResult``."""

from __future__ import annotations

from longmoe.pipelines.demo.result import DemoResult


def report_table(r: DemoResult) -> str:
    """The evaluation table (also pasted into the README)."""
    rows = [
        "| eval length | val loss (nats/token) | unigram baseline | model / unigram |",
        "|---|---|---|---|",
    ]
    for e in r.eval:
        tag = " (beyond training)" if e.beyond_training else ""
        rows.append(
            f"| {e.length:,}{tag} | {e.val_loss:.3f} | {e.unigram_loss:.3f} | "
            f"{e.val_loss / e.unigram_loss:.2f} |"
        )
    return "\n".join(rows)


def render_report(r: DemoResult) -> str:
    lines = [
        "# longmoe demo report",
        "",
        f"Tiny hybrid MoE model (`--preset tiny`: {r.params:,} parameters, 3:1 KDA:MLA, 8 experts top-2), "
        f"{r.steps} optimizer steps, {r.tokens:,} training tokens, {r.train_seconds:.0f} s "
        "of training on this machine's CPU. Data: the embedded standard-library corpus"
        + (" plus synthetic long-context task documents" if r.synthetic_documents else "")
        + ".",
        "",
        "## Curriculum",
        "",
        "| stage | window | token budget | short-window replay | val loss at stage end |",
        "|---|---|---|---|---|",
    ]
    for s in r.stages:
        v = "–" if s.val_loss_at_end is None else f"{s.val_loss_at_end:.3f}"
        lines.append(f"| {s.name} | {s.window:,} | {s.tokens:,} | {s.replay_fraction:.0%} | {v} |")
    lines += [
        "",
        "## Validation loss of the final model",
        "",
        "Held-out standard-library files, packed into windows of each length; the unigram baseline is a",
        "token-frequency model of the training split (add-one smoothing) scored on the same tokens.",
        "",
        report_table(r),
        "",
        "## Sample (temperature 0.7, top-p 0.9, seed 0)",
        "",
        "```python",
        r.sample.prompt + r.sample.completion,
        "```",
    ]
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in r.plots] + [""]
    return "\n".join(lines)
