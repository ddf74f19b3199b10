"""The demo's ``report.md`` (and the tables pasted into the README), from a ``DemoResult``."""

from __future__ import annotations

import math

from longmoe.pipelines.demo.result import DemoResult, RecallResult


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


def recall_table(rc: RecallResult) -> str:
    """Recall accuracy of the MQAR hybrid by eval length (also pasted into the README)."""
    rows = ["| eval length | recall accuracy | chance |", "|---|---|---|"]
    for n, a in rc.accuracy.items():
        k = int(n) // rc.train_len
        tag = " (training length)" if k == 1 else f" ({k}x training)"
        se = math.sqrt(a * (1 - a) / rc.answers)
        rows.append(f"| {int(n):,}{tag} | {a:.3f} ± {se:.3f} | {rc.chance:.3f} |")
    return "\n".join(rows)


def run_summary(d: dict) -> str:
    """What the last ``make demo`` run was and how long it took, from its result JSON (``report.json`` with
    its provenance): one line, rewritten with the tables so no timing in the docs outlives its run."""
    prov, rc = d.get("provenance") or {}, d.get("recall") or {}
    threads = prov.get("threads")
    parts = [
        f"{d['tokens']:,} tokens, {d['steps']} steps",
        str(prov.get("date") or "date not recorded"),
        f"{threads} thread{'s' if threads != 1 else ''}" if threads else "threads not recorded",
        f"commit {prov['commit']}" if prov.get("commit") else "commit not recorded",
    ]
    wall = f"**{prov['wall_s']:.1f} s** wall" if prov.get("wall_s") is not None else "wall time not recorded"
    line = (
        f"Last run ({', '.join(parts)}): the whole `make demo`, recall part included, {wall}; "
        f"language-model training {d['train_seconds']:.1f} s"
    )
    if rc.get("train_seconds") is not None:
        line += f", recall training {rc['train_seconds']:.1f} s ({rc['steps']} steps)"
    return line + "."


def can_and_cannot(r: DemoResult) -> list[str]:
    """What the trained models can and cannot do, in plain words, from the measured numbers."""
    ratio = max(e.val_loss / e.unigram_loss for e in r.eval)
    lines = [
        "## What the models can and cannot do",
        "",
        f"- The language model **cannot** write working code or hold a conversation: it has {r.params:,} "
        f"parameters and saw {r.tokens:,} tokens. It **has** learned more than token frequencies (its loss "
        f"is at most {ratio:.2f}x a unigram model's at every length, including past its training window); "
        "the sample below shows what that buys: code-shaped text, not programs.",
    ]
    rc = r.recall
    if rc is None:
        return lines + [""]
    accs = list(rc.accuracy.values())
    lens = [int(n) for n in rc.accuracy]
    verb = "**can**" if min(accs) >= 0.9 else ("partly can" if max(accs) >= 0.5 else "**cannot yet**")
    lines += [
        f"- A {len(rc.pattern)}-layer hybrid ({rc.pattern}: one KDA and one NoPE MLA layer, d_model "
        f"{rc.d_model}, {rc.params:,} parameters) trained for {rc.steps} steps ({rc.train_seconds:.0f} s) on "
        f"multi-query associative recall ({rc.n_pairs} key-value pairs, then the keys asked again, "
        f"{rc.train_len}-token rows) {verb} recall the value of every key: "
        + ", ".join(f"{a:.1%} at {n:,} tokens" for n, a in zip(lens, accs))
        + f" (chance {rc.chance:.1%}). The longer rows put the queries further from their pairs: "
        "attention looks them up at any distance, which is why the hybrid keeps attention layers.",
        "- It recalls exact tokens it was shown; it does not reason, and recall in natural-language "
        "documents (the language model above) is not shown at this scale.",
        "",
        "## Associative recall (MQAR)",
        "",
        recall_table(rc),
        "",
    ]
    return lines


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
        *can_and_cannot(r),
        "## Sample (temperature 0.7, top-p 0.9, seed 0)",
        "",
        "```python",
        r.sample.prompt + r.sample.completion,
        "```",
    ]
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in r.plots] + [""]
    return "\n".join(lines)
