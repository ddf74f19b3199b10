"""Training plots from ``metrics.jsonl``: ``loss.png`` (train/val loss over tokens, stage boundaries),
``balance.png`` (MaxVio per MoE layer over steps, dead experts, the last load histogram) and, for
fine-tuning runs, ``drift.png`` (routing drift from the starting model per MoE layer).

Also the ``longmoe plot RUN_DIR`` command, so a running or finished run can be looked at any time.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from longmoe.report.plotting import pyplot, save_figure
from longmoe.runlog import read_metrics

log = logging.getLogger(__name__)


def plot_loss(recs: list[dict[str, Any]], out: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    tr = [r for r in recs if "loss" in r]
    ax.plot([r["tokens"] for r in tr], [r["ce_loss"] for r in tr], lw=0.8, alpha=0.7, label="train CE")
    va = [r for r in recs if "val_loss" in r]
    if va:
        ax.plot([r["tokens"] for r in va], [r["val_loss"] for r in va], "o-", ms=4, label="validation")
    for a, b in zip(tr, tr[1:]):
        if a["stage"] != b["stage"]:
            ax.axvline(b["tokens"], color="grey", ls=":", lw=1)
            ax.text(b["tokens"], ax.get_ylim()[1], f" {b['stage_name']}", va="top", fontsize=8, color="grey")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title("loss through the context curriculum")
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, out, dpi=120)


def plot_balance(recs: list[dict[str, Any]], out: Path) -> Path | None:
    tr = [r for r in recs if "max_vio" in r]
    if not tr:
        return None
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in tr]
    for layer in range(len(tr[0]["max_vio"])):
        a1.plot(steps, [r["max_vio"][layer] for r in tr], lw=0.9, label=f"MoE layer {layer}")
    a1.set_xlabel("optimizer step")
    a1.set_ylabel("MaxVio = (max load - mean) / mean")
    a1.set_yscale("symlog", linthresh=0.1)
    a1.set_title(f"load balance (dead experts at the end: {tr[-1]['dead_experts']})", fontsize=10)
    a1.grid(alpha=0.3)
    a1.legend(fontsize=7)
    with_load = [r for r in recs if "load" in r]
    if with_load:
        load = with_load[-1]["load"]  # [layers][E]
        im = a2.imshow(load, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=a2, label="share of routed tokens")
        a2.set_xlabel("expert")
        a2.set_ylabel("MoE layer")
        a2.set_title(f"expert load at step {with_load[-1]['step']}", fontsize=10)
    return save_figure(fig, out, dpi=120)


def plot_drift(recs: list[dict[str, Any]], out: Path) -> Path | None:
    """Routing drift from the starting model (SFT/RL runs): changed top-k share and load TV per layer."""
    tr = [r for r in recs if "drift_changed" in r]
    if not tr:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    steps = [r["step"] for r in tr]
    for ax, key, label in (
        (axes[0], "drift_changed", "share of top-k choices changed"),
        (axes[1], "drift_load_tv", "load histogram change (total variation)"),
    ):
        for layer in range(len(tr[0][key])):
            ax.plot(steps, [r[key][layer] for r in tr], "o-", ms=3, lw=0.9, label=f"MoE layer {layer}")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("routing drift from the starting model", fontsize=10)
    return save_figure(fig, out, dpi=120)


def render(run_dir: str | Path) -> list[Path]:
    """Write ``loss.png``, (for MoE models) ``balance.png`` and (for fine-tuning runs that log routing
    drift) ``drift.png`` into the run directory."""
    run_dir = Path(run_dir)
    recs = read_metrics(run_dir)
    out = [plot_loss(recs, run_dir / "loss.png")]
    extra = [plot_balance(recs, run_dir / "balance.png"), plot_drift(recs, run_dir / "drift.png")]
    return out + [p for p in extra if p]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="training run directory (holds metrics.jsonl)")


def run(args: argparse.Namespace) -> int:
    for f in render(args.run_dir):  # a missing metrics.jsonl: FileNotFoundError, one line via longmoe.cli
        print(f)
    return 0
