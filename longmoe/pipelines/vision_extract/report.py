"""The recipe's report: ``OUT/report.md`` (tables), ``OUT/plots/curve.png`` (held-out F1 and loss by
step, image model vs text control) and ``OUT/plots/examples.png`` (example pages with truth and
prediction, wrong fields marked). No training or evaluation here."""

from __future__ import annotations

import math
from pathlib import Path

from longmoe.eval.extract.harness import flatten, parse_answer
from longmoe.pipelines.vision_extract.config import VisionExtractConfig
from longmoe.pipelines.vision_extract.result import VisionExtractResult
from longmoe.plotting import pyplot


def _pm(c: dict, m: str) -> str:
    v, se = c[m], c.get(f"{m}_se", float("nan"))
    return f"{v:.3f}" if se is None or math.isnan(se) else f"{v:.3f} ± {se:.3f}"


def family_table(result: VisionExtractResult) -> str:
    ctrl = result.control_eval or {}
    lines = [
        "| family | n | field F1 (image) | exact (image) | valid JSON (image) | field F1 (text control) |",
        "|---|---|---|---|---|---|",
    ]
    for fam, c in result.main_eval.items():
        t = _pm(ctrl[fam], "micro_f1") if fam in ctrl else "-"
        lines.append(
            f"| {fam} | {c['n']} | {_pm(c, 'micro_f1')} | {_pm(c, 'exact')} | {_pm(c, 'valid')} | {t} |"
        )
    return "\n".join(lines) + "\n"


def curve_table(result: VisionExtractResult) -> str:
    runs = [("image", result.main)] + ([("text control", result.control)] if result.control else [])
    lines = ["| run | step | train loss | held-out F1 |", "|---|---|---|---|"]
    for name, r in runs:
        for step, loss, f1 in r.curve:
            lines.append(f"| {name} | {int(step)} | {loss:.3f} | {f1:.3f} |")
    return "\n".join(lines) + "\n"


def markdown(result: VisionExtractResult, rc: VisionExtractConfig) -> str:
    f1 = result.form_easy_f1()
    verdict = (
        "not measured"
        if f1 is None
        else f"{f1:.3f} — target {result.target_f1} {'reached' if f1 >= result.target_f1 else 'NOT reached'}"
    )
    m = result.main
    out = [
        "# vision_extract: image -> JSON on rendered documents",
        "",
        f"Model: d_model {rc.d_model}, {rc.n_layers} layers ({rc.layer_pattern}), {rc.encoder} patch encoder "
        f"({rc.patch_size}-px patches), {m.params:,} parameters; trained from scratch on {rc.mix} for "
        f"{m.steps} steps of {rc.batch_size} in {m.seconds / 60:.1f} min ({rc.threads} thread(s)).",
        "",
        f"**form_easy held-out field F1: {verdict}.**",
        "",
        "## Held-out extraction per family",
        "",
        family_table(result),
        "Families outside the training mix are reported as measured (the model never saw them).",
        "",
    ]
    if result.control is not None:
        out += [
            f"The text-only control reads the same content given as text (the same model, batch and lr, "
            f"{result.control.steps} steps vs the main model's {m.steps}, {result.control.seconds / 60:.1f} "
            "min). The control was not tuned (no lr or step search of its own) and its text has no layout "
            "positions, so the gap between the columns does not separate reading pixels from extracting "
            "fields; it says only that this untuned text setup did worse in this budget.",
            "",
        ]
    p = result.pretrain
    if p is not None:
        out += [
            "## Interleaved pretraining check",
            "",
            f"The same LM trained {p.steps} steps on the same {p.text_tokens:,} text tokens, once alone and "
            f"once with {p.image_rows:,} image-document rows mixed into its batches:",
            "",
            "| text-only | text + images | difference | margin | within margin |",
            "|---|---|---|---|---|",
            f"| {p.text_only_val:.4f} | {p.mixed_val:.4f} | {p.delta:+.4f} | {p.margin} | "
            f"{'yes' if p.passed else 'NO'} |",
            "",
            "(text validation loss, nats per token, standard-library files held out of training)",
            "",
        ]
    out += ["## Training curve", "", curve_table(result), "", "![curve](plots/curve.png)", "",
            "## Examples", "", "![examples](plots/examples.png)", ""]  # fmt: skip
    for e in result.examples:
        out.append(f"- `{e.doc_id}` F1 {e.f1:.2f}: truth `{e.target}` — prediction `{e.prediction}`")
    return "\n".join(out) + "\n"


def plot_curve(result: VisionExtractResult, path: Path) -> None:
    plt = pyplot()

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    runs = [("image", result.main)] + ([("text control", result.control)] if result.control else [])
    for name, r in runs:
        if not r.curve:
            continue
        steps = [c[0] for c in r.curve]
        a.plot(steps, [c[2] for c in r.curve], marker="o", label=name)
        b.plot(steps, [c[1] for c in r.curve], marker="o", label=name)
    a.axhline(result.target_f1, color="grey", ls="--", lw=1)
    a.set(xlabel="step", ylabel="held-out field F1", ylim=(0, 1.02), title="form_easy F1")
    b.set(xlabel="step", ylabel="train loss (JSON tokens)", title="loss")
    a.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _errors(target: str, prediction: str) -> str:
    """The fields a prediction got wrong or missed, as ``path: got X`` lines."""
    gold = flatten(parse_answer(target) or {})
    pred = parse_answer(prediction)
    if pred is None:
        return "invalid JSON"
    p = flatten(pred)
    bad = [f"{k}: {p.get(k, '(missing)')}" for k, v in gold.items() if p.get(k) != v]
    bad += [f"{k}: extra" for k in p if k not in gold]
    return "; ".join(bad[:4]) + (" ..." if len(bad) > 4 else "") if bad else "all fields right"


def plot_examples(result: VisionExtractResult, out: Path, path: Path) -> None:
    """One row per example: the page (as the model saw it) on the left, truth, prediction and the
    wrong fields on the right."""
    import textwrap

    plt = pyplot()
    from PIL import Image

    exs = result.examples
    if not exs:
        return
    fig, axes = plt.subplots(
        len(exs), 2, figsize=(10, 1.5 * len(exs)), squeeze=False, gridspec_kw={"width_ratios": [1, 2.2]}
    )
    for (ax_img, ax_txt), e in zip(axes, exs):
        ax_img.imshow(Image.open(out / "examples" / e.image), cmap="gray", interpolation="nearest")
        ax_img.set_axis_off()
        ax_txt.set_axis_off()
        lines = [f"{e.doc_id}   field F1 {e.f1:.2f}"]
        for label, s in (
            ("truth", e.target),
            ("pred ", e.prediction),
            ("wrong", _errors(e.target, e.prediction)),
        ):
            wrapped = textwrap.wrap(s, 78, break_on_hyphens=False) or [""]
            lines += [f"{label}: {wrapped[0]}"] + [f"       {w}" for w in wrapped[1:3]]
        ax_txt.text(0, 1, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=6.5,
                    transform=ax_txt.transAxes)  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: VisionExtractResult, rc: VisionExtractConfig, out: Path) -> Path:
    plot_curve(result, out / "plots" / "curve.png")
    plot_examples(result, out, out / "plots" / "examples.png")
    path = out / "report.md"
    path.write_text(markdown(result, rc))
    return path
