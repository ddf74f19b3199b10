"""RL curves from ``metrics.jsonl``: reward, success, KL, routing drift, episode length and the rollout /
trainer log-prob mismatch by step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longmoe.report.plotting import pyplot, save_figure
from longmoe.runlog import read_metrics

PANELS = (
    ("reward", "reward (mean)"),
    ("success", "success rate"),
    ("kl", "KL to reference (k3)"),
    ("drift_changed_mean", "routing drift (changed top-k share)"),
    ("episode_tokens", "episode length (tokens)"),
    ("malformed", "malformed share"),
    (("mismatch_max", "mismatch_mean"), "rollout vs trainer |Δ log p| (max, mean)"),
)


def plot_curves(recs: list[dict[str, Any]], out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(16, 6))
    for ax, (keys, title) in zip(axes.flat, PANELS, strict=False):
        for key in (keys,) if isinstance(keys, str) else keys:
            pts = [(r["step"], r[key]) for r in recs if key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=".", label=key)
        if not isinstance(keys, str):
            ax.set_yscale("symlog", linthresh=1e-9)
            ax.legend(fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("RL step")
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    return save_figure(fig, out, dpi=90)


def render(run_dir: str | Path) -> list[Path]:
    recs = read_metrics(run_dir)
    return [plot_curves(recs, Path(run_dir) / "rl_curves.png")] if recs else []
