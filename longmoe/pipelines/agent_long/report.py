"""The long-horizon recipe's report: success by horizon per arm, differences paired by test task,
the verdict, the trajectory-length and success plots (no training or evaluation here)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from longmoe.pipelines.agent.report import episode_success, paired_difference, rl_summary
from longmoe.pipelines.agent.run import EVALS
from longmoe.pipelines.agent_long.config import CURRICULUM, AgentLongConfig
from longmoe.report.plotting import pyplot, save_figure

TIMING = "timing.json"  # RUN/timing.json: wall seconds and threads of each stage (the CPU hours)


def plot_lengths(lengths: dict[str, Any], out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.5 * len(lengths), 3.4), squeeze=False)
    for ax, (env, by_h) in zip(axes[0], sorted(lengths.items()), strict=True):
        every = [x for lens in by_h.values() for x in lens]
        bins = np.geomspace(0.9 * min(every), 1.1 * max(every), 40)  # shared, so horizons compare
        for h, lens in sorted(by_h.items(), key=lambda kv: int(kv[0])):
            ax.hist(lens, bins=bins, alpha=0.6, label=f"h={h}")
        ax.set_xscale("log")
        ax.set_title(f"{env}: expert episode length")
        ax.set_xlabel("tokens per episode")
        ax.set_ylabel("episodes")
        ax.legend()
    return save_figure(fig, out)


def _arm_success(evals: dict, names: list[str], horizons: list[int]) -> dict[int, tuple[float, float, int]]:
    """Per horizon: success pooled over the arm's seeds, its binomial SE, episodes."""
    out = {}
    for h in horizons:
        rows = [r for n in names for r in evals.get(n, []) if r["horizon"] == h]
        n = sum(r["episodes"] for r in rows)
        p = sum(r["success"] * r["episodes"] for r in rows) / max(n, 1)
        out[h] = (p, math.sqrt(p * (1 - p) / max(n, 1)), n)
    return out


def _paired(root: Path, a: list[str], b: list[str], h: int) -> dict[str, float] | None:
    """(mean over a's seeds) − (mean over b's seeds), paired by test task at horizon ``h``."""
    ta = [{k: v for k, v in episode_success(root, m).items() if k[1] == h} for m in a]
    tb = [{k: v for k, v in episode_success(root, m).items() if k[1] == h} for m in b]
    if not ta or not tb or not all(ta) or not all(tb):
        return None
    tasks = [t for t in ta[0] if all(t in x for x in ta + tb)]
    base = {t: sum(x[t] for x in tb) / len(tb) for t in tasks}
    return paired_difference(base, [{t: x[t] for t in tasks} for x in ta])


def verdict(d8: dict | None, d16: dict | None, quick: bool) -> str:
    """'step-wise advantages help more as the horizon grows': GiGPO − outcome at 16 vs at 8."""
    if quick:
        return "not measured (a --quick run: smoke-test budgets, its numbers mean nothing)"
    if d8 is None or d16 is None:
        return "not measured (an arm's episodes are missing)"
    grow, se = d16["diff"] - d8["diff"], math.hypot(d16["se"], d8["se"])
    if abs(grow) <= 2 * se:
        return f"not measurable at this scale: the gain grows by {100 * grow:+.1f} ± {100 * se:.1f} points"
    return (
        "confirmed" if grow > 0 else "refuted"
    ) + f": the gain grows by {100 * grow:+.1f} ± {100 * se:.1f} points"


def write_report(
    cfg: AgentLongConfig,
    root: Path,
    models: dict[str, list[str]],
    lengths: dict,
    bench: str | None,
    quick: bool,
) -> dict[str, Any]:
    evals = json.loads((root / EVALS).read_text()) if (root / EVALS).exists() else {}
    hs = list(cfg.eval_horizons)
    arms = {arm: _arm_success(evals, names, hs) for arm, names in models.items()}
    pairs = {}
    for a, b in (("gigpo", "outcome"), ("gigpo", "gigpo_nokl"), (CURRICULUM, "gigpo")):
        if a in models and b in models:
            pairs[f"{a} - {b}"] = {h: _paired(root, models[a], models[b], h) for h in hs}
    gig = pairs.get("gigpo - outcome", {})
    text = verdict(gig.get(8), gig.get(16), quick)
    timing = json.loads((root / TIMING).read_text()) if (root / TIMING).exists() else {}
    cpu_h = sum(t["wall_s"] * t["threads"] for t in timing.values()) / 3600
    lines = [
        f"# Long-horizon agents ({'quick' if quick else 'full'} run)",
        "",
        "## Expert trajectory lengths",
        "",
        "| env | horizon | episodes | mean tokens | max tokens |",
        "|---|---|---|---|---|",
    ]
    for env, by_h in sorted(lengths.items()):
        for h, lens in sorted(by_h.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {env} | {h} | {len(lens)} | {sum(lens) / len(lens):.0f} | {max(lens)} |")
    lines += ["", "![lengths](trajectory_lengths.png)", ""]
    if bench:
        lines += ["## Rollout throughput (bench/rollout_long.py)", "", bench.strip(), ""]
    lines += [
        "## Success by horizon per arm (held-out test tasks, seeds pooled)",
        "",
        "| arm | seeds | " + " | ".join(f"h={h}" for h in hs) + " |",
        "|---|---|" + "---|" * len(hs),
    ]
    for arm, by_h in arms.items():
        cells = [f"{100 * p:.1f} ± {100 * se:.1f} (n={n})" for p, se, n in (by_h[h] for h in hs)]
        lines.append(f"| {arm} | {len(models[arm])} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Paired differences (per test task, mean over seeds; ± SE over tasks)",
        "",
        "| comparison | " + " | ".join(f"h={h}" for h in hs) + " |",
        "|---|" + "---|" * len(hs),
    ]
    for k, by_h in pairs.items():
        cells = ["-" if d is None else f"{100 * d['diff']:+.1f} ± {100 * d['se']:.1f}" for d in by_h.values()]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"**Step-wise advantages help more as the horizon grows**: {text}.",
        "",
        f"CPU hours spent (wall x threads, all stages; on a shared machine this counts waiting too): "
        f"{cpu_h:.2f}.",
        "",
    ]
    summaries = {n: rl_summary(p) for n, p in sorted((p.name, p) for p in root.glob("rl_*") if p.is_dir())}
    lines += [
        "## RL runs: reward, KL and routing drift (means over the first / last 10 steps)",
        "",
        "| run | steps | reward first → last | KL last | drift changed last | load TV last |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in summaries.items():
        lines.append(
            f"| {n} | {r['steps']} | {r['reward_first']:.3f} → {r['reward_last']:.3f} | {r['kl_last']:.4f} | "
            f"{r['drift_changed_last']:.3f} | {r['drift_load_tv_last']:.3f} |"
        )
    report = {
        "config": cfg.to_dict(),
        "arms": {a: {str(h): v for h, v in b.items()} for a, b in arms.items()},
        "paired": {k: {str(h): d for h, d in v.items()} for k, v in pairs.items()},
        "verdict": text,
        "cpu_hours": cpu_h,
        "timing": timing,
        "rl_runs": summaries,
        "models": models,
        "lengths": lengths,
        "quick": quick,
    }
    (root / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (root / "report.md").write_text("\n".join(lines))
    plot_success(arms, root / "success_by_horizon.png")
    return report


def plot_success(arms: dict[str, dict[int, tuple[float, float, int]]], out: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for arm, by_h in arms.items():
        hs = sorted(by_h)
        ax.errorbar(
            hs, [by_h[h][0] for h in hs], yerr=[by_h[h][1] for h in hs], marker="o", capsize=3, label=arm
        )
    ax.set_xlabel("horizon (required tool calls)")
    ax.set_ylabel("held-out success")
    ax.set_ylim(-0.02, 1.02)
    ax.legend()
    return save_figure(fig, out)
