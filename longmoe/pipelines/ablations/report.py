"""Tables, figures and verdicts from the runs' results (no training here): ``OUT/report.md``,
``OUT/results.json``, ``OUT/figures/*.png``."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

from longmoe.pipelines.ablations.config import ARMS, DEPTHS, AblationConfig
from longmoe.pipelines.ablations.probes import FP32_EXP_LIMIT
from longmoe.pipelines.ablations.result import Check, RunResult, mean_se, paired_diff
from longmoe.report.plotting import pyplot

BALANCE_MIN_SEEDS = 5  # paired seeds before the balancers' loss cost gets a verdict

REPORT_MD = "report.md"
RESULTS_JSON = "results.json"
FIGURES = "figures"


def by_arm(results: list[RunResult], study: str) -> dict[str, list[RunResult]]:
    out: dict[str, list[RunResult]] = defaultdict(list)
    for r in results:
        if r.study == study:
            out[r.arm].append(r)
    return {a: sorted(out[a], key=lambda r: r.seed) for a in ARMS[study] if a in out}


def pm(m: float, se: float, digits: int = 3) -> str:
    if math.isnan(m):
        return "–"
    return f"{m:.{digits}f}" if math.isnan(se) else f"{m:.{digits}f} ± {se:.{digits}f}"


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(x) for x in r) + " |" for r in rows])


# ---------------------------------------------------------------------- decay
def decay_section(arms: dict[str, list[RunResult]]) -> tuple[str, list[Check]]:
    rows = []
    for arm, rs in arms.items():
        gam = [min(r.min_gamma) if r.min_gamma else math.nan for r in rs]
        over = [sum(g < FP32_EXP_LIMIT for g in r.min_gamma) for r in rs]
        o_max = [max((o for o in r.max_abs_o if math.isfinite(o)), default=math.nan) for r in rs]
        o_bad = [sum(not math.isfinite(o) for o in r.max_abs_o) for r in rs]
        rows.append([
            arm, f"{rs[0].spec['train']['lr']:g}", len(rs), " / ".join(str(r.nonfinite_events) for r in rs),
            " / ".join("yes" if r.diverged else "no" for r in rs),
            " / ".join(f"{g:.1f}" for g in gam), " / ".join(str(n) for n in over),
            " / ".join(f"{o:.3g}" for o in o_max), " / ".join(str(n) for n in o_bad),
            pm(*mean_se([r.train_loss_last for r in rs])), " / ".join(f"{r.val_loss:.3f}" for r in rs),
        ])  # fmt: skip
    md = table(
        ["gate", "lr", "seeds", "non-finite steps (per seed)", "diverged", "min 16-token Γ",
         "steps with Γ < −88", "max finite |KDA out|", "steps with non-finite KDA out",
         "train loss (last 10 finite)", "val loss (per seed)"],
        rows,
    )  # fmt: skip
    checks = []
    for arm in ("bounded", "bounded-hot"):
        if arm not in arms:
            continue
        rs = arms[arm]
        n = sum(r.nonfinite_events for r in rs)
        bad_o = sum(not math.isfinite(o) for r in rs for o in r.max_abs_o)
        g = min((min(r.min_gamma) for r in rs if r.min_gamma), default=math.nan)
        checks.append(Check(
            "decay", f"{arm} gate, bf16, all-GEMM chunk path: no non-finite loss, gradient or KDA output",
            n == 0 and bad_o == 0,
            f"{n} non-finite steps and {bad_o} non-finite KDA outputs over {len(rs)} seeds; min Γ {g:.1f} "
            f"(bound: 16 · g_min = −80 > −88)",
        ))  # fmt: skip
    for arm in ("softplus", "softplus-hot"):
        if arm not in arms:
            continue
        rs = arms[arm]
        n = sum(r.nonfinite_events for r in rs)
        bad_o = sum(not math.isfinite(o) for r in rs for o in r.max_abs_o)
        g = min((min(r.min_gamma) for r in rs if r.min_gamma), default=math.nan)
        over = sum(x < FP32_EXP_LIMIT for r in rs for x in r.min_gamma)
        checks.append(Check(
            "decay", f"unbounded {arm} gate, bf16, same all-GEMM path: non-finite events",
            n > 0 or bad_o > 0 or any(r.diverged for r in rs),
            f"{n} non-finite steps, {bad_o} non-finite KDA outputs, {sum(r.diverged for r in rs)} diverged "
            f"runs over {len(rs)} seeds; min Γ {g:.1f}, {over} steps with Γ < −88 "
            f"(the all-GEMM form overflows only there)",
        ))  # fmt: skip
    return md, checks


# ---------------------------------------------------------------------- attention residuals
def attnres_section(arms: dict[str, list[RunResult]]) -> tuple[str, list[Check]]:
    rows, checks, diffs = [], [], {}
    for depth in DEPTHS:
        a, p = arms.get(f"attnres-{depth}"), arms.get(f"plain-{depth}")
        if not a or not p:
            continue
        d, se, n = paired_diff(a, p, "val_loss")
        diffs[depth] = (d, se)
        for name, rs in (("block attention residuals", a), ("plain residuals", p)):
            rows.append([
                depth, name, f"{rs[0].params:,}", rs[0].tokens, len(rs),
                pm(*mean_se([r.val_loss for r in rs]), 4),
                " / ".join(f"{r.val_loss:.4f}" for r in rs),
                pm(d, se, 4) if name.startswith("block") else "",
            ])  # fmt: skip
        checks.append(Check(
            "attnres", f"{depth}: block attention residuals reach a lower validation loss than plain ones",
            d < 0 and (math.isnan(se) or abs(d) > 2 * se),
            f"val loss difference (attnres − plain, paired by seed) {pm(d, se, 4)} over {n} seeds "
            "(confirmed only when below zero by more than 2 standard errors)",
        ))  # fmt: skip
    if len(diffs) == 2:
        (dt, st), (dd, sd) = diffs["tiny"], diffs["deep"]
        gap_se = math.hypot(st, sd)
        checks.append(Check(
            "attnres", "the gain is larger in the deeper, thinner stack (where depth should matter)",
            dd < dt and (math.isnan(gap_se) or dt - dd > 2 * gap_se),
            f"difference deep {pm(dd, sd, 4)} vs tiny {pm(dt, st, 4)}",
        ))  # fmt: skip
    md = table(
        ["depth", "residuals", "params", "tokens", "seeds", "val loss (mean ± SE)", "per seed",
         "attnres − plain (paired)"],
        rows,
    )  # fmt: skip
    return md, checks


# ---------------------------------------------------------------------- balancers
def balance_section(arms: dict[str, list[RunResult]]) -> tuple[str, list[Check]]:
    rows, stats = [], {}
    for arm, rs in arms.items():
        vio = mean_se([r.final_max_vio for r in rs])
        stats[arm] = (vio, [r.dead_experts for r in rs], mean_se([r.val_loss for r in rs]))
        rows.append([
            arm, len(rs), f"{rs[0].max_vio_curve[0]:.2f}" if rs[0].max_vio_curve else "–", pm(*vio),
            " / ".join(str(r.dead_experts) for r in rs), pm(*mean_se([r.router_entropy for r in rs])),
            pm(*mean_se([r.val_loss for r in rs]), 4),
        ])  # fmt: skip
    md = table(
        ["balancer", "seeds", "MaxVio step 1", "final MaxVio (mean ± SE)", "dead experts (per seed)",
         "router entropy", "val loss (mean ± SE)"],
        rows,
    )  # fmt: skip
    checks = []
    if set(stats) == set(ARMS["balance"]):
        free = max(stats[a][0][0] for a in ("quantile", "sign"))
        other = min(stats[a][0][0] for a in ("aux", "none"))
        checks.append(Check(
            "balance", "the loss-free balancers (quantile, sign) end better balanced than aux and none",
            free < other,
            ", ".join(f"{a} {pm(*stats[a][0], 2)}" for a in ARMS["balance"]) + " final MaxVio",
        ))  # fmt: skip
        dead = {a: sum(stats[a][1]) for a in stats}
        checks.append(Check(
            "balance", "without a balancer experts die; the loss-free balancers keep every expert",
            dead["none"] > 0 and dead["quantile"] == 0 and dead["sign"] == 0,
            ", ".join(f"{a} {dead[a]}" for a in ARMS["balance"]) + " dead experts (summed over seeds)",
        ))  # fmt: skip
        diffs = {a: paired_diff(arms[a], arms["none"], "val_loss") for a in ("quantile", "sign", "aux")}
        n = min(d[2] for d in diffs.values())
        checks.append(Check(
            "balance", "the loss-free balancers cost no validation loss against none (paired by seed, "
            "each difference within 2 SE of 0 or below it)",
            all(d <= 2 * se for d, se, _ in list(diffs.values())[:2] if not math.isnan(se)),
            ", ".join(f"{a} − none {pm(d, se, 4)}" for a, (d, se, _) in diffs.items())
            + f" over {n} paired seeds" + ("" if n >= BALANCE_MIN_SEEDS else
                                            f" (a verdict needs >= {BALANCE_MIN_SEEDS})"),
            enough_seeds=n >= BALANCE_MIN_SEEDS,
        ))  # fmt: skip
    return md, checks


# ---------------------------------------------------------------------- figures
def plot_figures(results: list[RunResult], fig_dir: Path) -> list[Path]:
    plt = pyplot()

    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    decay = by_arm(results, "decay")
    if decay:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for i, (arm, rs) in enumerate(decay.items()):
            for r in rs:
                kw = {"color": f"C{i}", "alpha": 0.8, "lw": 1, "label": arm if r is rs[0] else None}
                ax1.plot(range(1, len(r.loss_curve) + 1), r.loss_curve, **kw)
                ax2.plot(range(1, len(r.min_gamma) + 1), r.min_gamma, **kw)
        ax2.axhline(FP32_EXP_LIMIT, color="k", ls="--", lw=0.8, label="fp32 e^{−Γ} overflow (−88)")
        ax1.set(xlabel="optimizer step", ylabel="training loss (bf16 autocast)", title="loss")
        ax2.set(xlabel="optimizer step", ylabel="min 16-token Γ", title="most negative in-chunk log-decay")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend()
        paths.append(_save(fig, fig_dir / "decay.png"))
    att = by_arm(results, "attnres")
    if att:
        fig, ax = plt.subplots(figsize=(6, 4))
        for j, depth in enumerate(DEPTHS):
            for i, res in enumerate(("attnres", "plain")):
                rs = att.get(f"{res}-{depth}", [])
                if rs:
                    m, se = mean_se([r.val_loss for r in rs])
                    x = j * 3 + i
                    ax.bar(x, m, yerr=0 if math.isnan(se) else se, color=f"C{i}", capsize=4,
                           label=res if j == 0 else None)  # fmt: skip
                    ax.scatter([x] * len(rs), [r.val_loss for r in rs], color="k", s=8, zorder=3)
        ax.set_xticks(
            [0.5, 3.5], [f"{d} ({'d=64, 4 layers' if d == 'tiny' else 'd=32, 12 layers'})" for d in DEPTHS]
        )
        lo = min(r.val_loss for rs in att.values() for r in rs)
        hi = max(r.val_loss for rs in att.values() for r in rs)
        ax.set_ylim(lo - 0.1 * (hi - lo + 0.1), hi + 0.1 * (hi - lo + 0.1))
        ax.set(ylabel="validation loss (mean ± SE, dots: seeds)", title="attention vs plain residuals")
        ax.legend()
        paths.append(_save(fig, fig_dir / "attnres.png"))
    bal = by_arm(results, "balance")
    if bal:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for i, (arm, rs) in enumerate(bal.items()):
            for r in rs:
                ax.plot(range(1, len(r.max_vio_curve) + 1), r.max_vio_curve, color=f"C{i}", lw=1,
                        alpha=0.8, label=arm if r is rs[0] else None)  # fmt: skip
        ax.set_yscale("log")
        ax.set(xlabel="optimizer step", ylabel="windowed MaxVio (mean over MoE layers)", title="balancers")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        paths.append(_save(fig, fig_dir / "balance.png"))
    return paths


def _save(fig: object, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt = pyplot()

    plt.close(fig)
    return path


# ---------------------------------------------------------------------- report
SECTIONS = {"decay": decay_section, "attnres": attnres_section, "balance": balance_section}
TITLES = {
    "decay": "Bounded vs unbounded decay: stability in bf16",
    "attnres": "Attention residuals vs plain residuals",
    "balance": "Balancers",
}


def render(cfg: AblationConfig, results: list[RunResult]) -> tuple[str, list[Check]]:
    parts, checks = [], []
    for study in cfg.studies:
        arms = by_arm(results, study)
        if not arms:
            continue
        md, cs = SECTIONS[study](arms)
        steps = cfg.steps(study)
        title = TITLES[study] + (f" at E = {cfg.balance_experts}" if study == "balance" else "")
        parts.append(
            f"## {title}\n\n{steps} steps × {cfg.batch_size} × {cfg.window} tokens per run, "
            f"seeds {cfg.seeds(study)}.\n\n{md}\n\n"
            + "\n".join(f"- **{c.verdict}**: {c.expectation}. {c.evidence}." for c in cs)
            + f"\n\n![{study}]({FIGURES}/{study}.png)\n"
        )
        checks += cs
    return "# Ablations at tiny scale\n\n" + "\n".join(parts), checks


def write_report(cfg: AblationConfig, results: list[RunResult], out: Path) -> list[Check]:
    md, checks = render(cfg, results)
    plot_figures(results, out / FIGURES)
    (out / REPORT_MD).write_text(md)
    payload = {
        "config": cfg.to_dict(),
        "checks": [{"study": c.study, "expectation": c.expectation, "verdict": c.verdict,
                    "evidence": c.evidence} for c in checks],  # fmt: skip
        "runs": [
            {k: v for k, v in r.to_dict().items() if k not in ("spec", "loss_curve", "min_gamma", "max_abs_o",
                                                                 "max_vio_curve")}
            for r in results
        ],
    }  # fmt: skip
    (out / RESULTS_JSON).write_text(json.dumps(payload, indent=2) + "\n")
    return checks
