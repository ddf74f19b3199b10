"""The long-row stage's report: recall by length and placement per variant (mean ± standard error over
seeds, the seeds counted, chance ``1/P`` beside), the far lengths at one seed (binomial standard error
over the answers), the attention entropy at the answers, the issue's target and the remedies' paired
differences, and a recall-by-length plot.

Writes ``OUT/long_results.json``, ``OUT/long_report.md`` and ``OUT/plots/recall_by_length.png``;
``publish`` copies the JSON and the plot into ``docs/results`` and ``docs/figures`` (``python -m
bench.tables`` then writes the table into docs/benchmarks.md through ``tables``).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

from longmoe.pipelines.mqar.checks import HYBRIDS
from longmoe.pipelines.mqar.long_config import LongConfig, Variant
from longmoe.report.plotting import pyplot

LONG_RESULTS = "long_results.json"
LONG_REPORT = "long_report.md"
PLOT = "plots/recall_by_length.png"
PUBLISHED_JSON = "docs/results/mqar_long_results.json"
PUBLISHED_PLOT = "docs/figures/mqar_recall_by_length.png"
TRAIN = "train"  # the placement name of the training-length row (the sweep's own test rows)


def _mean_se(xs: list[float]) -> tuple[float, float | None]:
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def _binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n else math.nan


def _name(cell: dict[str, Any]) -> str:
    return Variant(cell["pattern"], cell["position"], cell.get("logn_scale", 0.0)).name


def summarise(
    lc: LongConfig, training: dict[str, Any], records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One entry per variant x placement x length (and the training length, placement ``train``: the
    sweep's test rows, ``eval_n`` rows of ``n_pairs`` answers): the per-seed accuracies, their mean and
    standard error over seeds (None with one seed), the answers pooled with their binomial standard
    error, and the mean attention entropy."""
    train_len, answers = int(training["train_len"]), int(training["eval_n"]) * lc.n_pairs
    cells: dict[tuple[str, str, int], list[tuple[int, dict[str, Any]]]] = {}
    for rec in records:
        name, seed = _name(rec["cell"]), rec["cell"]["seed"]
        acc = rec["train"]["accuracy"][str(train_len)]
        cells.setdefault((name, TRAIN, train_len), []).append(
            (seed, {"acc": acc, "correct": round(acc * answers), "answers": answers, "entropy": None})
        )
        for placement, by_len in rec["recall"].items():
            for n, m in by_len.items():
                cells.setdefault((name, placement, int(n)), []).append((seed, m))
    order = {v.name: i for i, v in enumerate(lc.variants)}
    out = []
    for (name, placement, n), ms in sorted(
        cells.items(), key=lambda kv: (order.get(kv[0][0], 99), kv[0][1:])
    ):
        ms.sort()
        accs = [m["acc"] for _, m in ms]
        mean, se = _mean_se(accs)
        correct, answers = sum(m["correct"] for _, m in ms), sum(m["answers"] for _, m in ms)
        ents = [m["entropy"] for _, m in ms if m.get("entropy") is not None]
        out.append(
            {
                "variant": name,
                "placement": placement,
                "length": n,
                "seeds": [s for s, _ in ms],
                "acc": accs,
                "mean": round(mean, 4),
                "se": None if se is None else round(se, 4),
                "answers": answers,
                "pooled_se": round(_binomial_se(correct / answers, answers), 4) if answers else None,
                "entropy": round(sum(ents) / len(ents), 3) if ents else None,
            }
        )
    return out


def _find(summary: list[dict[str, Any]], name: str, placement: str, n: int) -> dict[str, Any] | None:
    return next(
        (s for s in summary if (s["variant"], s["placement"], s["length"]) == (name, placement, n)), None
    )


def _cell(s: dict[str, Any] | None) -> str:
    if s is None:
        return "not measured"
    k = len(s["seeds"])
    if s["se"] is None:
        return f"{s['mean']:.3f} ± {s['pooled_se']:.3f}¹"
    return f"{s['mean']:.3f} ± {s['se']:.3f}" + ("" if k == 3 else f" ({k} seeds)")


def _len(n: int) -> str:
    if n % (1 << 20) == 0:
        return f"{n >> 20}M"
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def _against(mean: float, se: float, target: float) -> str:
    """A target is met only when the whole ± one standard error interval is on its side (the headline
    rules, docs/benchmarks.md), missed when the whole interval is below it, else unresolved."""
    if mean - se >= target:
        return "met"
    if mean + se < target:
        return "missed"
    return "unresolved (± 1 SE straddles the target)"


def checks(lc: LongConfig, summary: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The issue's target for every hybrid (recall >= target at the longest length, queries uniform;
    ``_against``), whether NoPE attention alone (``M+conv``) keeps its training-length recall, and each
    remedy against its plain model (paired by seed: mean difference ± standard error over seeds)."""
    top, out = max(lc.lengths), []
    names = [v.name for v in lc.variants]
    for h in [v.name for v in lc.variants if v.pattern in HYBRIDS]:  # the remedies' hybrids too
        s = _find(summary, h, "uniform", top)
        claim = f"target: hybrid {h} recall >= {lc.target} at {top:,} tokens, queries uniform over the row"
        if s is None:
            out.append({"claim": claim, "verdict": "not measured", "evidence": "no runs"})
            continue
        se = s["se"] if s["se"] is not None else s["pooled_se"]
        out.append(
            {
                "claim": claim,
                "verdict": _against(s["mean"], se, lc.target),
                "evidence": f"{s['mean']:.3f} ± {se:.3f} over seeds {s['seeds']} (per seed "
                + " / ".join(f"{a:.3f}" for a in s["acc"])
                + f"); chance {1 / lc.n_pairs:.3f}",
            }
        )
    nope = Variant("M", "conv").name
    base = next((x for x in summary if (x["variant"], x["placement"]) == (nope, TRAIN)), None)
    for placement in lc.placements:
        s = _find(summary, nope, placement, top)
        if base is None or s is None:
            continue
        se = s["se"] if s["se"] is not None else s["pooled_se"]
        out.append(
            {
                "claim": f"NoPE attention alone ({nope}) keeps its training-length recall at {top:,} tokens, "
                f"queries {placement} (within 0.05)",
                "verdict": "confirmed" if s["mean"] >= base["mean"] - 0.05 else "not confirmed",
                "evidence": f"{base['mean']:.3f} at {base['length']} tokens; {s['mean']:.3f} ± {se:.3f} "
                f"at {top:,}",
            }
        )
    for v in lc.variants:
        plain = Variant(v.pattern, v.position).name
        if not v.logn_scale or plain not in names:
            continue
        for placement in lc.placements:
            diffs = []
            for n in lc.lengths:
                a, b = _find(summary, v.name, placement, n), _find(summary, plain, placement, n)
                if a is None or b is None:
                    continue
                paired = [
                    x - dict(zip(b["seeds"], b["acc"]))[s]
                    for s, x in zip(a["seeds"], a["acc"])
                    if s in b["seeds"]
                ]
                if paired:
                    diffs.append((n, *_mean_se(paired), len(paired)))
            if not diffs:
                continue
            n, d, se, k = diffs[-1]
            if se is None:
                verdict = "not measurable (one seed)"
            elif d - 2 * se > 0:
                verdict = "helps"
            elif d + 2 * se < 0:
                verdict = "hurts"
            else:
                verdict = "no difference beyond 2 SE"
            out.append(
                {
                    "claim": f"remedy: {v.name} (s = {v.logn_scale:g}) against {plain}, queries {placement}, "
                    f"at {n:,} tokens",
                    "verdict": verdict,
                    "evidence": "paired by seed, mean difference ± SE: "
                    + "; ".join(
                        f"{_len(m)} {x:+.3f}"
                        + ("" if e is None else f" ± {e:.3f}")
                        + f" ({j} seed{'s' * (j > 1)})"
                        for m, x, e, j in diffs
                    ),
                }
            )
    return out


def tables(lc: LongConfig, train_len: int, summary: list[dict[str, Any]], check_list: list[dict]) -> str:
    """The markdown of the stage: recall per placement, the far lengths, the entropy, the checks."""
    chance = 1 / lc.n_pairs
    lens = sorted(lc.lengths)
    head = "| model | " + " | ".join([f"{train_len} (train)", *(_len(n) for n in lens)]) + " |"
    rule = "|---|" + "---|" * (1 + len(lens))
    out = []
    for placement, title in (
        ("uniform", "queries uniform over the row (distant from their pairs)"),
        ("near", "queries near their pairs, at the end of the row (filler before)"),
    ):
        if placement not in lc.placements:
            continue
        out += [f"Recall, {title}; mean ± SE over seeds {lc.seeds}:", "", head, rule]
        for v in lc.variants:
            cells = [_cell(_find(summary, v.name, TRAIN, train_len))]
            cells += [_cell(_find(summary, v.name, placement, n)) for n in lens]
            out.append(f"| {v.name} | " + " | ".join(cells) + " |")
        out += ["| chance 1/P | " + " | ".join([f"{chance:.3f}"] * (1 + len(lens))) + " |", ""]
    if lc.far_lengths:
        far = sorted(lc.far_lengths)
        out += [
            f"Far lengths, seed(s) {lc.far_seeds} (¹ ± binomial SE over the answers):",
            "",
            "| model | queries | " + " | ".join(_len(n) for n in far) + " |",
            "|---|---|" + "---|" * len(far),
        ]
        for name in lc.far_variants:
            for placement in lc.placements:
                cells = []
                for n in far:
                    s = _find(summary, name, placement, n)
                    cells.append(
                        "not measured"
                        if s is None
                        else f"{s['mean']:.3f} ± {s['pooled_se']:.3f}¹ of {s['answers']}"
                    )
                out.append(f"| {name} | {placement} | " + " | ".join(cells) + " |")
        out.append("")
    ent_vs = [v for v in lc.variants if "M" in v.pattern]
    if ent_vs and "uniform" in lc.placements:
        out += [
            "Attention entropy of the last (MLA) layer at the answers, queries uniform, nats (mean over "
            "seeds, answers and heads; a uniform spread over the whole row would be ln T):",
            "",
            "| model | " + " | ".join(_len(n) for n in lens) + " |",
            "|---|" + "---|" * len(lens),
        ]
        for v in ent_vs:
            cells = []
            for n in lens:
                s = _find(summary, v.name, "uniform", n)
                cells.append("not measured" if s is None or s["entropy"] is None else f"{s['entropy']:.2f}")
            out.append(f"| {v.name} | " + " | ".join(cells) + " |")
        out += ["| ln T | " + " | ".join(f"{math.log(n):.2f}" for n in lens) + " |", ""]
    out += ["| check | verdict | measured |", "|---|---|---|"]
    out += [f"| {c['claim']} | **{c['verdict']}** | {c['evidence']} |" for c in check_list]
    return "\n".join(out).rstrip()


def plot(lc: LongConfig, train_len: int, summary: list[dict[str, Any]], path: Path) -> None:
    """Recall vs length (log scale), one panel per placement, one line per variant (± SE over seeds),
    the far lengths as open markers, chance dashed."""
    plt = pyplot()
    panels = [p for p in ("uniform", "near") if p in lc.placements]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, placement in zip(axes[0], panels):
        for v in lc.variants:
            pts = [
                s
                for n in [train_len, *sorted(lc.lengths)]
                if (s := _find(summary, v.name, TRAIN if n == train_len else placement, n))
            ]
            if not pts:
                continue
            line = ax.errorbar(
                [s["length"] for s in pts],
                [s["mean"] for s in pts],
                yerr=[s["se"] or 0.0 for s in pts],
                marker="o",
                capsize=3,
                label=v.name,
            )
            far = [s for n in lc.far_lengths if (s := _find(summary, v.name, placement, n))]
            if far:
                ax.errorbar(
                    [s["length"] for s in far],
                    [s["mean"] for s in far],
                    yerr=[s["pooled_se"] for s in far],
                    marker="s",
                    mfc="none",
                    ls=":",
                    capsize=3,
                    color=line[0].get_color(),
                    label=f"{v.name}, seed {lc.far_seeds[0]}",
                )
        ax.axhline(1 / lc.n_pairs, ls="--", color="grey", label=f"chance 1/{lc.n_pairs}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"row length, tokens (trained at {train_len})")
        ax.set_ylabel("recall (answers right)")
        ax.set_title(f"MQAR, {lc.n_pairs} pairs, queries {placement}")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(
    lc: LongConfig,
    training: dict[str, Any],
    records: list[dict[str, Any]],
    out: Path,
    provenance: dict[str, Any] | None,
) -> dict[str, Any]:
    """Summary, checks, tables and plot of ``records``; returns the results object written."""
    train_len = int(training["train_len"])
    summary = summarise(lc, training, records)
    check_list = checks(lc, summary)
    cpu = sum(
        r.get("train_cpu_s", 0.0) + sum(m["cpu_s"] for by in r["recall"].values() for m in by.values())
        for r in records
    )
    result = {
        "settings": lc.to_dict(),
        "training": training,
        "chance": 1 / lc.n_pairs,
        "cpu_s_total": round(cpu, 1),
        "summary": summary,
        "checks": check_list,
        "models": records,
        "provenance": provenance,
    }
    md = tables(lc, train_len, summary, check_list)
    (out / LONG_RESULTS).write_text(json.dumps(result, indent=2) + "\n")
    (out / LONG_REPORT).write_text(f"# MQAR at long lengths\n\n{md}\n")
    if summary:
        plot(lc, train_len, summary, out / PLOT)
    return result


def render(result: dict[str, Any]) -> str:
    """The docs table of a published results object (what ``bench.tables`` writes between markers)."""
    lc = LongConfig.from_dict(result["settings"])
    return tables(lc, int(result["training"]["train_len"]), result["summary"], result["checks"])


def publish(out: Path, root: Path) -> list[Path]:
    """Copy the stage's results JSON and plot into the repository's docs (``PUBLISHED_*``)."""
    done = []
    for src, dst in ((out / LONG_RESULTS, root / PUBLISHED_JSON), (out / PLOT, root / PUBLISHED_PLOT)):
        if not src.is_file():
            raise FileNotFoundError(f"{src}: nothing to publish (run the long stage first)")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        done.append(dst)
    return done
