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
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from longmoe import checkpoint as ckpt
from longmoe.data.chat import encode_chat
from longmoe.data.tokenizer import Tokenizer
from longmoe.envs import make_env, play
from longmoe.envs.suites import suite_cells
from longmoe.eval.agent.harness import held_out_seeds
from longmoe.pipelines.agent.run import (
    choose_rl_lr,
    evaluate,
    open_recipe,
    pretrain,
    rl,
    rl_run_name,
    say,
    sft,
)
from longmoe.pipelines.agent_long.config import ARMS, CURRICULUM, AgentLongConfig
from longmoe.pipelines.agent_long.report import TIMING, plot_lengths, write_report

LENGTHS = "lengths.json"
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
    cfg, root = open_recipe(cfg)
    base = _timed(root, "pretrain", pretrain, cfg, root)
    tok = Tokenizer.from_file(base / ckpt.TOKENIZER_FILE)
    lengths = _timed(root, "lengths", expert_lengths, cfg, root, tok)
    bench = _timed(root, "bench", rollout_bench, cfg, quick)
    tuned = _timed(root, "sft", sft, cfg, root, base)
    _timed(root, "eval_sft", evaluate, cfg, root, "sft", tuned, cfg.eval_episodes)
    lr = _timed(root, "rl_lr", choose_rl_lr, cfg, root, tuned)
    models = _timed(root, "rl_arms", run_arms, cfg, root, tuned, lr)
    return write_report(cfg, root, {"sft": ["sft"], **models}, lengths, bench, quick)
