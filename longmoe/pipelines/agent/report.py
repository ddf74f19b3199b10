"""The agent recipe's report: success by horizon (with standard errors), the RL gain over SFT at the
horizons where SFT is neither near 0 nor near 1, the paired difference RL − SFT over the same test
tasks (per task: the mean over RL seeds minus SFT; its standard error over tasks), the ablation rows
(with KL and routing drift from their RL logs, and whether their seeds allow ranking them),
``success.png``; written to ``RUN/report.md`` and ``RUN/report.json``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from longmoe.eval.agent.harness import EPISODES_FILE
from longmoe.eval.plots import success_by_horizon
from longmoe.pipelines.agent.config import AgentRecipeConfig
from longmoe.runlog import read_metrics

MAIN = ("pretrained", "sft", "sft+rl")
TARGET_GAIN = 0.10  # RL over SFT, absolute, at a horizon where SFT is in MID
MID = (0.1, 0.9)
RL_LR = "rl_lr.json"  # RUN/rl_lr.json: the chosen RL lr and each candidate's validation success
SUMMARY_STEPS = 10  # RL steps averaged for the "first" and "last" columns of the ablation table


def _pm(p: float, se: float) -> str:
    return f"{100 * p:.1f} ± {100 * se:.1f}"


def pooled(rows: list[dict[str, Any]]) -> tuple[float, float, int]:
    """Success over all horizons together: rate, standard error, episodes."""
    n = sum(r["episodes"] for r in rows)
    p = sum(r["success"] * r["episodes"] for r in rows) / max(n, 1)
    return p, math.sqrt(p * (1 - p) / max(n, 1)), n


def rl_summary(run: Path, window: int = SUMMARY_STEPS) -> dict[str, Any]:
    """Means over the first and the last ``window`` RL steps (one step's reward is 64 episodes: too
    noisy to compare alone) and the run's step count."""
    recs = read_metrics(run) if run.exists() else []

    def mean(part: list[dict[str, Any]], k: str) -> float:
        vals = [r[k] for r in part if k in r]
        return sum(vals) / len(vals) if vals else float("nan")

    head, tail = recs[:window], recs[-window:]
    return {
        "steps": recs[-1]["step"] if recs else 0,
        "reward_first": mean(head, "reward"),
        "reward_last": mean(tail, "reward"),
        "kl_last": mean(tail, "kl"),
        "drift_changed_last": mean(tail, "drift_changed_mean"),
        "drift_load_tv_last": mean(tail, "drift_load_tv_mean"),
        "mismatch_max_last": max(
            (r["mismatch_max"] for r in tail if "mismatch_max" in r), default=float("nan")
        ),
        "mismatch_mean_last": mean(tail, "mismatch_mean"),
    }


def episode_success(root: Path, name: str) -> dict[tuple[str, int, int], float]:
    """Per test task ``(env, horizon, seed)``, the success of model ``name`` (its episodes file)."""
    f = root / "evals" / name / EPISODES_FILE
    if not f.is_file():
        return {}
    rs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return {(r["env"], r["horizon"], r["seed"]): float(r["success"]) for r in rs}


def paired_difference(sft: dict, rls: list[dict]) -> dict[str, float] | None:
    """RL − SFT paired by test task: per task the mean success over the RL seeds minus SFT's, then the
    mean over tasks and its standard error (``sd / sqrt(n)``); ``None`` without shared tasks."""
    tasks = [t for t in sft if all(t in r for r in rls)] if rls else []
    if not tasks:
        return None
    d = [sum(r[t] for r in rls) / len(rls) - sft[t] for t in tasks]
    mu = sum(d) / len(d)
    sd = math.sqrt(sum((x - mu) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else math.nan
    return {"diff": mu, "se": sd / math.sqrt(len(d)), "tasks": len(d), "rl_seeds": len(rls)}


def horizon_gains(evals: dict[str, list[dict]], rl_names: list[str], per_task: dict[str, dict]) -> list[dict]:
    """RL (mean over its seeds) − SFT at each horizon where SFT is in ``MID``; the standard error is
    paired by test task when every model's episodes are on disk, else the unpaired one."""
    if "sft" not in evals or not rl_names:
        return []
    out = []
    for i, a in enumerate(evals["sft"]):
        if not MID[0] <= a["success"] <= MID[1]:
            continue
        h = a["horizon"]
        rl = sum(evals[m][i]["success"] for m in rl_names) / len(rl_names)
        at_h = {m: {t: v for t, v in per_task[m].items() if t[1] == h} for m in per_task}
        pd = paired_difference(at_h["sft"], [at_h[m] for m in rl_names])
        if pd is not None and pd["tasks"] > 1:
            se, paired = pd["se"], True
        else:
            rl_se = math.sqrt(sum(evals[m][i]["se"] ** 2 for m in rl_names)) / len(rl_names)
            se, paired = math.sqrt(a["se"] ** 2 + rl_se**2), False
        out.append({"horizon": h, "sft": a["success"], "rl": rl, "gain": rl - a["success"], "stderr": se,
                    "rl_seeds": len(rl_names), "paired": paired})  # fmt: skip
    return out


def seed_success(evals: dict[str, list[dict]], rl_names: list[str]) -> dict[str, Any] | None:
    """Pooled held-out success of each RL seed, their mean and the seed-to-seed standard deviation."""
    if not rl_names:
        return None
    ps = [pooled(evals[m])[0] for m in rl_names]
    mu = sum(ps) / len(ps)
    sd = math.sqrt(sum((p - mu) ** 2 for p in ps) / (len(ps) - 1)) if len(ps) > 1 else math.nan
    return {"per_seed": dict(zip(rl_names, ps, strict=True)), "mean": mu, "seed_sd": sd}


def seed_lines(s: dict[str, Any] | None) -> list[str]:
    """``seed_success``'s numbers as a sentence (none for fewer than two seeds)."""
    if s is None or len(s["per_seed"]) < 2:
        return []
    each = ", ".join(f"{100 * p:.1f}" for p in s["per_seed"].values())
    return [f"RL seeds (pooled held-out success, %): {each}; mean {100 * s['mean']:.1f}, seed-to-seed "
            f"standard deviation {100 * s['seed_sd']:.1f} points.", ""]  # fmt: skip


def lr_lines(val: dict[str, Any] | None) -> list[str]:
    """The RL learning-rate choice on the validation task seeds (``RUN/rl_lr.json``'s content)."""
    if len((val or {}).get("validation_success") or {}) < 2:
        return []
    cells = ", ".join(f"{float(lr):g}: {100 * p:.1f}" for lr, p in val["validation_success"].items())
    return [f"RL learning rate chosen on validation task seeds (disjoint from the test seeds), pooled "
            f"success %: {cells} → **{val['lr']:g}**.", ""]  # fmt: skip


def rl_runs(cfg: AgentRecipeConfig, root: Path) -> dict[str, Path]:
    """Model name -> its RL run directory (the chosen lr from ``RUN/rl_lr.json``; the pre-protocol
    layout ``RUN/rl``, ``RUN/rl_<ablation>`` where that is what the run holds)."""
    if (root / "rl").is_dir():
        return {"sft+rl": root / "rl", **{f"sft+rl:{a}": root / f"rl_{a}" for a in cfg.ablations}}
    f = root / RL_LR
    lr = json.loads(f.read_text())["lr"] if f.is_file() else cfg.rl_lrs[0]
    out = {}
    for s in range(cfg.rl_seeds):
        out["sft+rl" + (f"#s{s}" if s else "")] = root / f"rl_lr{lr:g}_s{s}"
    for a in cfg.ablations:
        for s in range(cfg.ablation_seeds):
            out[f"sft+rl:{a}" + (f"#s{s}" if s else "")] = root / f"rl_{a}_lr{lr:g}_s{s}"
    return out


def plot_success(evals: dict[str, list[dict]], out: Path) -> Path:
    """The main models (solid) and the RL ablations (dotted), drawn by the evaluation's own plot."""
    shown = {m: rows for m, rows in evals.items() if m in MAIN or m.startswith("sft+rl:")}
    ablations = {m for m in shown if m not in MAIN}
    return success_by_horizon(shown, out, dashed=ablations, xlabel="required tool calls (horizon)")


def write_report(cfg: AgentRecipeConfig, root: Path, evals: dict[str, list[dict]]) -> dict[str, Any]:
    horizons = cfg.eval_horizons
    lines = [f"# Agent recipe ({cfg.env}, env_args {json.dumps(cfg.env_args)})", ""]
    lines += ["## Held-out success by horizon (%, ± standard error)", ""]
    lines += [
        "| model | "
        + " | ".join(f"h={h}" for h in horizons)
        + " | all (n) | malformed | tool-call validity | tokens/episode |"
    ]
    lines += ["|" + "---|" * (len(horizons) + 5)]
    for name, rows in evals.items():
        p, se, n = pooled(rows)
        cells = [_pm(r["success"], r["se"]) for r in rows]
        bad = sum(r["malformed"] * r["episodes"] for r in rows) / n
        tok = sum(r["tokens"] * r["episodes"] for r in rows) / n
        valid = sum((r["validity"] or 0.0) * r["episodes"] for r in rows) / n
        lines.append(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {_pm(p, se)} ({n}) | {100 * bad:.1f} | {100 * valid:.1f} | "
            f"{tok:.0f} |"
        )
    rl_names = [m for m in evals if m == "sft+rl" or m.startswith("sft+rl#")]
    per_task = {m: episode_success(root, m) for m in ["sft", *rl_names]}
    gains = horizon_gains(evals, rl_names, per_task)
    met = any(g["gain"] >= TARGET_GAIN for g in gains)
    lines += [
        "",
        f"## RL over SFT where SFT success is in [{MID[0]}, {MID[1]}] "
        f"(target: +{100 * TARGET_GAIN:.0f} points)",
        "",
    ]
    k = len(rl_names)
    lines += [f"| horizon | SFT | SFT+RL (mean of {k} seed{'s' * (k > 1)}) | gain (points, ± se) |",
              "|---|---|---|---|"]  # fmt: skip
    for g in gains:
        lines.append(f"| {g['horizon']} | {100 * g['sft']:.1f} | {100 * g['rl']:.1f} | "
                     f"{100 * g['gain']:+.1f} ± {100 * g['stderr']:.1f} |")  # fmt: skip
    how = "paired by test task" if gains and gains[0]["paired"] else "unpaired: no per-task episodes"
    lines += ["", f"Standard errors {how}. Target met: **{'yes' if met else 'no'}**.", ""]
    seeds = seed_success(evals, rl_names)
    lr_file = root / RL_LR
    lr_choice = json.loads(lr_file.read_text()) if lr_file.is_file() else None
    lines += seed_lines(seeds) + lr_lines(lr_choice)
    paired = paired_difference(per_task["sft"], [per_task[m] for m in rl_names])
    lines += ["## RL − SFT, paired over the same test tasks", ""]
    if paired is None:
        lines += ["No per-task episodes of both SFT and RL yet.", ""]
    else:
        lines += [
            f"Mean over {paired['tasks']} test tasks of (success averaged over {paired['rl_seeds']} RL "
            f"seed(s) − SFT success): **{100 * paired['diff']:+.1f} ± {100 * paired['se']:.1f} points** "
            "(± one standard error, paired by task)."
            + (" One RL seed: the seed-to-seed spread of RL is not in this number." if paired["rl_seeds"] < 2
               else ""),
            "",
        ]  # fmt: skip
    runs = rl_runs(cfg, root)
    summaries = {k: rl_summary(v) for k, v in runs.items()}
    lines += ["## RL runs: the seeds, then the ablations (each a full RL run from the same SFT model, one "
              "field changed)", ""]  # fmt: skip
    w = SUMMARY_STEPS
    lines += [f"| run | held-out success (all) | RL reward, first → last {w} steps | KL (last {w}) | "
              f"drift: changed top-k (last {w}) | drift: load TV (last {w}) |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for name, s in summaries.items():
        if name not in evals:
            continue
        p, se, n = pooled(evals[name])
        lines.append(
            f"| {name} | {_pm(p, se)} ({n}) | {s['reward_first']:.3f} → {s['reward_last']:.3f} | "
            f"{s['kl_last']:.4f} | {s['drift_changed_last']:.4f} | {s['drift_load_tv_last']:.4f} |"
        )
    rank = (
        "A single RL run per arm differs from another seed of the same arm by an unmeasured amount, so "
        "these rows cannot be ranked against each other or against the main run."
        if cfg.ablation_seeds < 2
        else "Compare arms by their mean over seeds; a gap inside the seed spread does not rank them."
    )
    lines += ["", f"Ablations: {cfg.ablation_seeds} RL seed(s) each. {rank}"]
    mism = "; ".join(
        f"{k} max {s['mismatch_max_last']:.2g}, mean {s['mismatch_mean_last']:.2g}"
        for k, s in summaries.items()
    )
    lines += ["", f"Rollout vs trainer log-probs of the sampled tokens (|Δ log p|, last {w} steps; "
              "the update takes PPO's ratio against the trainer's own and corrects the rest by TIS): "
              f"{mism}."]  # fmt: skip
    lines += ["", "Curves: `rl_*/rl_curves.png` (reward, success, KL, drift, episode length); success vs "
              "horizon: `success.png`.", ""]  # fmt: skip
    plot_success(evals, root / "success.png")
    data = {"config": cfg.to_dict(), "evals": evals, "gains": gains, "target_met": met, "rl": summaries,
            "paired_rl_minus_sft": paired, "rl_seed_success": seeds, "rl_lr": lr_choice}  # fmt: skip
    (root / "report.json").write_text(json.dumps(data, indent=1) + "\n")
    (root / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return data
