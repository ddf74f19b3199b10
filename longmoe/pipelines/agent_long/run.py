"""The long-horizon agent recipe, stage by stage; every stage is skipped when its output exists.

1. **lengths**: the scripted expert on the long suite (``envs/suites.py``: doclookup, calculator,
   sql at horizons 8, 16, 32) on test seeds, tokens per episode (``RUN/lengths.json``,
   ``RUN/trajectory_lengths.png``);
2. **rollout throughput** at horizon 32 with and without sessions: ``bench/rollout_long.py`` (a
   source checkout only; its table goes into the report);
3. **pretrain + SFT** as the agent recipe does (``pipelines/agent/run.py``), SFT horizons up to 8;
4. **RL arms** from the same SFT model at the target horizons (8 and 16): the learning rate chosen
   on the validation block with the GiGPO arm (``choose_rl_lr``), then every arm (``config.ARMS``:
   outcome-only, GiGPO, GiGPO without KL) at ``rl_seeds`` seeds, and the horizon curriculum (GiGPO,
   the first half of the steps at ``curriculum_horizons``); each model scored on held-out test tasks
   by horizon as soon as it exists;
5. **report**: success by horizon per arm, differences paired by test task with their standard
   errors, the verdict on "step-wise advantages help more as the horizon grows", CPU hours spent.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longmoe import checkpoint as ckpt
from longmoe.data.chat import encode_chat
from longmoe.data.tokenizer import Tokenizer
from longmoe.envs import make_env, play
from longmoe.envs.suites import suite_cells
from longmoe.eval.agent.harness import held_out_seeds
from longmoe.pipelines.agent.report import episode_success, paired_difference, rl_summary
from longmoe.pipelines.agent.run import (
    EVALS,
    RECIPE_CONFIG,
    choose_rl_lr,
    evaluate,
    pretrain,
    rl,
    rl_run_name,
    say,
    sft,
)
from longmoe.pipelines.agent_long.config import ARMS, CURRICULUM, AgentLongConfig
from longmoe.plotting import pyplot

LENGTHS = "lengths.json"
TIMING = "timing.json"  # RUN/timing.json: wall seconds and threads of each stage (the CPU hours)
REPO = Path(__file__).resolve().parents[3]


def expert_lengths(cfg: AgentLongConfig, root: Path, tokenizer: Tokenizer) -> dict[str, Any]:
    """Tokens per expert episode of the long suite (test seeds), per env and horizon."""
    path = root / LENGTHS
    if path.exists():
        return json.loads(path.read_text())
    say("expert trajectory lengths of the long suite")
    out: dict[str, Any] = {}
    for (env, h), fields in suite_cells("long").items():
        lens = []
        for s in held_out_seeds(cfg.expert_episodes, cfg.seed):
            ep = play(make_env(env, **fields), s)
            assert ep.reward == 1.0, (env, h, s)
            lens.append(len(encode_chat(tokenizer, ep.messages).ids))
        out.setdefault(env, {})[str(h)] = lens
    path.write_text(json.dumps(out) + "\n")
    plot_lengths(out, root / "trajectory_lengths.png")
    return out


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
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def rollout_bench(cfg: AgentLongConfig, quick: bool) -> str | None:
    """Run ``bench/rollout_long.py`` (``--quick`` for a quick recipe); its markdown table, or None
    outside a source checkout."""
    if not cfg.bench or not (REPO / "bench" / "rollout_long.py").is_file():
        return None
    name = "rollout_long_quick" if quick else "rollout_long"
    md = REPO / "bench" / "results" / f"{name}.md"
    say(f"rollout throughput: python -m bench.rollout_long{' --quick' if quick else ''}")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "bench.rollout_long"] + (["--quick", "--no-http"] if quick else [])
    subprocess.run(cmd, cwd=REPO, env=env, check=True)
    return md.read_text() if md.is_file() else None


def arm_model(arm: str, seed: int) -> str:
    return f"{arm}#s{seed}"


def run_arms(cfg: AgentLongConfig, root: Path, tuned: Path, lr: float) -> dict[str, list[str]]:
    """Every arm at every seed (+ the curriculum), each evaluated on the test tasks; arm -> model names."""
    models: dict[str, list[str]] = {}
    for s in range(cfg.rl_seeds):
        for arm in cfg.arms:
            name = rl_run_name(lr, s, None if arm == "gigpo" else arm)  # GiGPO seed 0 is the lr run
            path = rl(cfg, root, tuned, name, {**ARMS[arm], "lr": lr, "seed": cfg.seed + s})
            evaluate(cfg, root, arm_model(arm, s), path, cfg.eval_episodes)
            models.setdefault(arm, []).append(arm_model(arm, s))
        if cfg.curriculum:
            steps = int(cfg.rl["steps"])
            short = {"horizons": list(cfg.curriculum_horizons), "steps": max(1, steps // 2)}
            first = rl(
                cfg,
                root,
                tuned,
                rl_run_name(lr, s, CURRICULUM + "_short"),
                {**short, "lr": lr, "seed": cfg.seed + s},
            )
            path = rl(
                cfg,
                root,
                first,
                rl_run_name(lr, s, CURRICULUM),
                {"steps": max(1, steps - steps // 2), "lr": lr, "seed": cfg.seed + s},
            )
            evaluate(cfg, root, arm_model(CURRICULUM, s), path, cfg.eval_episodes)
            models.setdefault(CURRICULUM, []).append(arm_model(CURRICULUM, s))
    return models


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
        f"CPU hours spent (wall x threads, all stages): {cpu_h:.2f}.",
        "",
    ]
    summaries = {n: rl_summary(p) for n, p in sorted((p.name, p) for p in root.glob("rl_*") if p.is_dir())}
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
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _timed(root: Path, stage: str, fn, *args):
    """Run a stage, adding its wall time and threads to ``RUN/timing.json`` (the CPU-hour count)."""
    t0 = time.perf_counter()
    out = fn(*args)
    path = root / TIMING
    timing = json.loads(path.read_text()) if path.exists() else {}
    prev = timing.get(stage, {"wall_s": 0.0})["wall_s"]
    timing[stage] = {"wall_s": prev + time.perf_counter() - t0, "threads": torch.get_num_threads()}
    path.write_text(json.dumps(timing, indent=1) + "\n")
    return out


def run_recipe(cfg: AgentLongConfig, quick: bool = False) -> dict[str, Any]:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    root = Path(cfg.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    saved = root / RECIPE_CONFIG
    if saved.exists():
        cfg = AgentLongConfig.load(saved)  # a resumed recipe keeps its settings
    else:
        cfg.save(saved)
    base = _timed(root, "pretrain", pretrain, cfg, root)
    tok = Tokenizer.from_file(base / ckpt.TOKENIZER_FILE)
    lengths = _timed(root, "lengths", expert_lengths, cfg, root, tok)
    bench = _timed(root, "bench", rollout_bench, cfg, quick)
    tuned = _timed(root, "sft", sft, cfg, root, base)
    _timed(root, "eval_sft", evaluate, cfg, root, "sft", tuned, cfg.eval_episodes)
    lr = _timed(root, "rl_lr", choose_rl_lr, cfg, root, tuned)
    models = _timed(root, "rl_arms", run_arms, cfg, root, tuned, lr)
    return write_report(cfg, root, {"sft": ["sft"], **models}, lengths, bench, quick)
