"""The recipe's report: ``OUT/report.md`` (tables), ``OUT/plots/curve.png`` (held-out F1 and loss by
step, image model vs text control) and ``OUT/plots/examples.png`` (example pages with truth and
prediction, wrong fields marked). No training or evaluation here."""

from __future__ import annotations

import math
from pathlib import Path

from longmoe.eval.extract.harness import f1_with_interval, flatten, parse_answer
from longmoe.pipelines.vision_extract.config import VisionExtractConfig
from longmoe.pipelines.vision_extract.errors import LONG, ROTATED_DEG, error_table
from longmoe.pipelines.vision_extract.result import VisionExtractResult
from longmoe.pipelines.vision_extract.train import curve_family
from longmoe.report.plotting import pyplot


def _pm(c: dict, m: str) -> str:
    v, se = c[m], c.get(f"{m}_se", float("nan"))
    return f"{v:.3f}" if se is None or math.isnan(se) else f"{v:.3f} ± {se:.3f}"


def family_table(result: VisionExtractResult) -> str:
    ctrl = result.control_eval or {}
    lines = [
        "| family | n | field F1 (image) [95% CI] | exact (image) | valid JSON (image) "
        "| field F1 (text control) [95% CI] |",
        "|---|---|---|---|---|---|",
    ]
    for fam, c in result.main_eval.items():
        t = f1_with_interval(ctrl[fam]) if fam in ctrl else "-"
        lines.append(
            f"| {fam} | {c['n']} | {f1_with_interval(c)} | {_pm(c, 'exact')} | {_pm(c, 'valid')} | {t} |"
        )
    return "\n".join(lines) + "\n"


def control_text(result: VisionExtractResult, main_steps: int) -> list[str]:
    """What the control was (input, budget, lr choice) and what its column may be read as."""
    c, ch = result.control, result.control_lr
    if c is None:
        return []
    kind = ch["inputs"] if ch else c.inputs
    what = (
        "the page's text laid out as a character grid (line = row, character = column) through a linear "
        "projector of each cell's character code (a character embedding) with the row/column embeddings a "
        "patch gets, and the same patch-reading loss (each cell reads its character)"
        if kind == "text_grid"
        else "the page's text as a plain token stream (no positions)"
    )
    out = [f"The text-only control reads {what}: {c.steps} steps vs the image model's {main_steps}, "
           f"{c.seconds / 60:.1f} min"
           + (f" ({c.cpu_seconds / 60:.1f} CPU min)." if c.cpu_seconds is not None else ".")]  # fmt: skip
    if ch:
        cands = ", ".join(
            f"{x['lr']:g} → {x['val_f1']:.3f} (loss {x['val_loss']:.3f})" for x in ch["candidates"]
        )
        out[0] += (f" Its learning rate was chosen on {ch['val_n']} VALIDATION pages of {ch['val_family']} "
                   f"(seeds {ch['val_seeds'][0]:,}..{ch['val_seeds'][1] - 1:,}, disjoint from training and "
                   f"test), {ch['search_steps']} steps per candidate (lr → validation F1, ties broken by the "
                   f"validation loss: {cands}): "
                   f"lr {ch['lr']:g}.")  # fmt: skip
    out += ["", "The gap between the image and control columns compares pixels with the same content as "
            "clean symbols at the same positions; it is not by itself a measure of 'reading pixels' "
            "against 'extracting fields'.", ""]  # fmt: skip
    return out


def curve_table(result: VisionExtractResult) -> str:
    runs = [("image", result.main)] + ([("text control", result.control)] if result.control else [])
    lines = ["| run | step | train loss | held-out F1 |", "|---|---|---|---|"]
    for name, r in runs:
        for step, loss, f1 in r.curve:
            lines.append(f"| {name} | {int(step)} | {loss:.3f} | {f1:.3f} |")
    return "\n".join(lines) + "\n"


def verdict(result: VisionExtractResult, fam: str) -> str:
    """``fam``'s held-out F1 against the target: met by the point estimate, and whether the interval's
    lower end clears it too (confirmed at 95%)."""
    c = result.main_eval.get(fam)
    if c is None:
        return f"**{fam} held-out field F1: not measured.**"
    f1, lo = c["micro_f1"], c.get("micro_f1_lo", c["micro_f1"])
    if f1 < result.target_f1:
        word = "NOT met"
    elif lo >= result.target_f1:
        word = "met, confirmed at 95%"
    else:
        word = "met by the point estimate, not confirmed at 95%"
    return (
        f"**{fam} held-out field F1: {f1_with_interval(c)} (n={c['n']}) — target {result.target_f1} {word}.**"
    )


def errors_section(result: VisionExtractResult) -> list[str]:
    if not result.errors:
        return []
    return ["## Where the image model's errors are", "",
            "Every ground-truth field of the held-out pages above, wrong (another value or missing) or "
            "right, tagged (`longmoe/pipelines/vision_extract/errors.py`; tags overlap): `shared_patch` two "
            f"of its glyph centres in one patch, `long` ≥ {LONG} characters, `number` digits and "
            f"separators, `rotated` the page turned ≥ {ROTATED_DEG}°, `not_text` read from a chart, not "
            "drawn as glyphs. Cells: wrong / fields with the tag.", "",
            error_table(result.errors), ""]  # fmt: skip


def markdown(result: VisionExtractResult, rc: VisionExtractConfig) -> str:
    m = result.main
    out = [
        "# vision_extract: image -> JSON on rendered documents",
        "",
        f"Model: d_model {rc.d_model}, {rc.n_layers} layers ({rc.layer_pattern}), {rc.encoder} patch encoder "
        f"({rc.patch_size}-px patches), {m.params:,} parameters; patch-reading loss weight {rc.read_weight}; "
        f"trained from scratch on {rc.mix} for "
        f"{m.steps} steps of {rc.batch_size} in {m.seconds / 60:.1f} min ({rc.threads} thread(s)"
        + (f", {m.cpu_seconds / 60:.1f} CPU min" if m.cpu_seconds is not None else "")
        + ").",
        "",
        *[
            line
            for fam in (result.target_families or [result.target_family])
            for line in (verdict(result, fam), "")
        ],
        "",
        "## Held-out extraction per family",
        "",
        family_table(result),
        "F1 is pooled over a family's pages; the interval is a 95% page bootstrap, widened by the "
        "Clopper-Pearson interval of the page success rate when every page scores 0 or 1. Families "
        "outside the training mix are reported as measured (the model never saw them).",
        "",
        *control_text(result, m.steps),
        *errors_section(result),
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


def plot_curve(result: VisionExtractResult, path: Path, family: str = "form_easy") -> None:
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
    a.set(xlabel="step", ylabel="held-out field F1", ylim=(0, 1.02), title=f"{family} F1")
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
    plot_curve(result, out / "plots" / "curve.png", ", ".join(rc.curve_families or [curve_family(rc)]))
    plot_examples(result, out, out / "plots" / "examples.png")
    path = out / "report.md"
    path.write_text(markdown(result, rc))
    return path
