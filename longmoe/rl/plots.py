"""RL curves from ``metrics.jsonl``: reward, success, KL, routing drift and episode length by step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from longmoe.plotting import pyplot
from longmoe.runlog import read_metrics

PANELS = (
    ("reward", "reward (mean)"),
    ("success", "success rate"),
    ("kl", "KL to reference (k3)"),
    ("drift_changed_mean", "routing drift (changed top-k share)"),
    ("episode_tokens", "episode length (tokens)"),
    ("malformed", "malformed share"),
)


def plot_curves(recs: list[dict[str, Any]], out: Path) -> Path:
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, (key, title) in zip(axes.flat, PANELS, strict=True):
        pts = [(r["step"], r[key]) for r in recs if key in r]
        if pts:
            ax.plot(*zip(*pts, strict=True), marker=".")
        ax.set_title(title)
        ax.set_xlabel("RL step")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def render(run_dir: str | Path) -> list[Path]:
    recs = read_metrics(run_dir)
    return [plot_curves(recs, Path(run_dir) / "rl_curves.png")] if recs else []
