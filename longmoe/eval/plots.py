"""Plots of eval results (``longmoe.report.plotting.pyplot``: Agg, files only, matplotlib imported lazily).

- ``heatmap``: accuracy of one task by length (x) and needle depth (y).
- ``accuracy_vs_length``: one panel per task, one line per run (compare models or layer patterns).
- ``ppl_curve``: loss by position for one or more runs, with the training window marked.
- ``success_by_horizon``: agent episode success (± standard error) by horizon, one panel per
  environment, one line per run (compare models, or pretrained / SFT / RL: the agent recipe's
  report draws its ``success.png`` with it too).
``plot_run(OUT)`` draws all that a run directory holds (``summary.json``, ``ppl.json``,
``agent_summary.json``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from longmoe.report.plotting import pyplot, save_figure


def _len_label(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def heatmap(
    summary: dict[str, Any], task: str, path: str | Path, metric: str = "all", title: str = ""
) -> Path:
    cells = [c for c in summary["cells"] if c["task"] == task]
    if not cells:
        raise ValueError(f"no results for task {task!r} in the summary")
    lengths = sorted({c["length"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    grid = [[math.nan] * len(lengths) for _ in depths]
    for c in cells:
        grid[depths.index(c["depth"])][lengths.index(c["length"])] = c[metric]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.0 + 0.5 * len(depths)))
    im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto", origin="upper")
    ax.set_xticks(range(len(lengths)), [_len_label(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("depth")
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v == v:
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title(title or f"{task}: {metric}")
    fig.colorbar(im, ax=ax, fraction=0.05)
    return save_figure(fig, path)


def accuracy_vs_length(
    runs: dict[str, dict[str, Any]],
    path: str | Path,
    metric: str = "all",
    window: int | None = None,
    ylim: tuple[float, float] | None = (-0.05, 1.05),
    ylabel: str | None = None,
) -> Path:
    """``runs``: label -> summary (``by_length`` rows with ``metric``). One panel per task; a dashed
    line marks the training window. Any per-(task, length) metric plots this way (e.g. answer loss
    with ``ylim=None``)."""
    tasks = sorted({r["task"] for s in runs.values() for r in s["by_length"]})
    if not tasks:
        raise ValueError("no results to plot")
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.0), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for label, s in runs.items():
            pts = sorted((r["length"], r[metric]) for r in s["by_length"] if r["task"] == task)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if window:
            ax.axvline(window, color="gray", ls="--", lw=1)
        ax.set_xscale("log", base=2)
        lens = sorted({r["length"] for s in runs.values() for r in s["by_length"] if r["task"] == task})
        ax.set_xticks(lens, [_len_label(n) for n in lens])
        ax.minorticks_off()
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_title(task)
        ax.set_xlabel("context length (tokens)")
    axes[0][0].set_ylabel(ylabel or f"accuracy ({metric})")
    axes[0][-1].legend(fontsize=8)
    return save_figure(fig, path)


def ppl_curve(runs: dict[str, dict[str, Any]], path: str | Path) -> Path:
    """``runs``: label -> ``ppl_by_position`` result."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    window = None
    for label, res in runs.items():
        xs = [(b["start"] + b["end"]) / 2 for b in res["buckets"]]
        ax.plot(xs, [b["loss"] for b in res["buckets"]], label=label)
        window = res["window"]
    if window:
        ax.axvline(window, color="gray", ls="--", lw=1, label="training window")
    ax.set_xlabel("position (tokens of context)")
    ax.set_ylabel("next-token loss")
    ax.legend(fontsize=8)
    ax.set_title("loss by position")
    return save_figure(fig, path)


def success_by_horizon(
    runs: dict[str, list[dict[str, Any]]],
    path: str | Path,
    dashed: frozenset[str] | set[str] = frozenset(),
    xlabel: str = "horizon",
) -> Path:
    """``runs``: label -> an agent summary's ``by_horizon`` rows (env, horizon, success, se); one
    panel per environment, one line per run, error bars of one standard error. Runs in ``dashed``
    are drawn dotted (secondary lines, e.g. ablations next to the main models)."""
    envs = sorted({r["env"] for rows in runs.values() for r in rows})
    if not envs:
        raise ValueError("no agent results to plot")
    plt = pyplot()
    fig, axes = plt.subplots(1, len(envs), figsize=(max(4.5, 3.4 * len(envs)), 3.4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        for label, rows in runs.items():
            pts = sorted((r["horizon"], r["success"], r["se"]) for r in rows if r["env"] == env)
            if pts:
                xs, ys, es = zip(*pts)
                style = ":" if label in dashed else "-"
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=label, linestyle=style)
        hs = sorted({r["horizon"] for rows in runs.values() for r in rows if r["env"] == env})
        ax.set_xticks(hs)
        ax.set_ylim(-0.05, 1.05)
        ax.set_title(env)
        ax.set_xlabel(xlabel)
    axes[0][0].set_ylabel("episode success")
    axes[0][-1].legend(fontsize=8)
    return save_figure(fig, path)


def plot_run(out_dir: str | Path, metric: str = "all") -> list[Path]:
    """Every plot a run directory supports, written to ``OUT/plots/``."""
    out = Path(out_dir)
    written = []
    s_file, p_file = out / "summary.json", out / "ppl.json"
    if s_file.is_file():
        summary = json.loads(s_file.read_text())
        if summary.get("cells"):
            for task in sorted({c["task"] for c in summary["cells"]}):
                written.append(heatmap(summary, task, out / "plots" / f"heatmap_{task}.png", metric))
            written.append(
                accuracy_vs_length({out.name: summary}, out / "plots" / "accuracy_vs_length.png", metric)
            )
    a_file = out / "agent_summary.json"
    if a_file.is_file():
        agent = {out.name: json.loads(a_file.read_text())["by_horizon"]}
        written.append(success_by_horizon(agent, out / "plots" / "agent_success_by_horizon.png"))
    if p_file.is_file():
        written.append(
            ppl_curve({out.name: json.loads(p_file.read_text())}, out / "plots" / "ppl_by_position.png")
        )
    return written
