"""The agent recipe, stage by stage; every stage is skipped when its output exists (resumable).

1. **pretrain** a tiny model (the ``tiny`` preset) on 256-token windows of the embedded corpus;
2. **SFT** (``train/sft.py``) on the environment's expert demonstrations, loss on assistant tokens;
3. **RL** (``rl/trainer.py``) from the SFT model: with several ``rl_lrs`` one run per lr at the first
   seed, each scored on the *validation* block of task seeds (``envs.seeds``; ``RUN/val_evals.json``),
   the best lr kept; then ``rl_seeds`` runs at that lr; plus ``ablation_seeds`` runs per ablation;
4. **evaluate** each model on held-out test tasks by horizon (``eval/agent_local.py``, through the engine,
   scored by ``eval/agent.summarize`` exactly as ``longmoe eval --tasks agent`` scores any backend)
   as soon as it exists (``RUN/evals.json``), so a run cut short still has its first rows;
5. **report**: ``RUN/report.md`` + ``report.json`` (tables with standard errors), ``success.png``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from longmoe import checkpoint as ckpt
from longmoe.data.stages import CurriculumStage
from longmoe.envs import make_env
from longmoe.envs.seeds import validation_offset
from longmoe.eval.agent.harness import summarize
from longmoe.eval.agent.local import run_local_eval
from longmoe.pipelines.agent.config import ABLATIONS, AgentRecipeConfig
from longmoe.pipelines.agent.report import RL_LR, pooled, write_report
from longmoe.presets import preset
from longmoe.rl.config import RLConfig
from longmoe.rl.plots import render as render_rl
from longmoe.rl.trainer import RLTrainer
from longmoe.serve.engine import Engine
from longmoe.train.config import TrainConfig
from longmoe.train.pretrain import Trainer
from longmoe.train.run import train_tokenizer
from longmoe.train.sft import SFTConfig, SFTTrainer, sft_stage

log = logging.getLogger(__name__)
RECIPE_CONFIG = "recipe_config.json"
C = TypeVar("C", bound=AgentRecipeConfig)  # a recipe config saved in its run directory
EVALS = "evals.json"  # RUN/evals.json: model name -> per-horizon results (filled as they finish)
VAL_EVALS = "val_evals.json"  # the same on validation task seeds (the RL lr choice)


def say(msg: str) -> None:
    print(f"[agent] {time.strftime('%H:%M:%S')} {msg}", flush=True)


def pretrain(cfg: AgentRecipeConfig, root: Path) -> Path:
    run = root / "pretrain"
    if (run / ckpt.FINAL_DIR).exists():
        return run / ckpt.FINAL_DIR
    say("pretraining")
    if (run / ckpt.CONFIG_FILE).exists():
        tr = Trainer(run, resume=True, progress=False)
    else:
        mcfg = preset("tiny")
        stage = CurriculumStage("pretrain-256", window=256, tokens=cfg.pretrain_tokens,
                                batch_size=cfg.pretrain_batch, mix={"file": 1.0})  # fmt: skip
        tcfg = TrainConfig(stages=[stage], seed=cfg.seed, eval_every=0, ckpt_every=50, val_windows=2)
        tr = Trainer(run, mcfg, tcfg, train_tokenizer(mcfg.vocab_size), progress=False)
    tr.fit()
    return run / ckpt.FINAL_DIR


def sft(cfg: AgentRecipeConfig, root: Path, init: Path) -> Path:
    run = root / "sft"
    if (run / ckpt.FINAL_DIR).exists():
        return run / ckpt.FINAL_DIR
    say("SFT")
    if (run / "sft_config.json").exists():
        tr = SFTTrainer(run, resume=True, progress=False)
    else:
        scfg = SFTConfig(
            init_from=str(init), envs={cfg.env: 1.0}, horizons=list(cfg.sft_horizons),
            env_options={cfg.env: dict(cfg.env_args)}, max_len=1024, drift_every=25,
        )  # fmt: skip
        stage = sft_stage(cfg.sft_steps, cfg.sft_batch, 0.1, 256, {"file": 1.0})
        tcfg = TrainConfig(stages=[stage], lr=cfg.sft_lr, warmup_steps=10, seed=cfg.seed, eval_every=0,
                           ckpt_every=100, val_windows=2)  # fmt: skip
        tr = SFTTrainer(run, scfg, tcfg, progress=False)
    tr.fit()
    return run / ckpt.FINAL_DIR


def rl(cfg: AgentRecipeConfig, root: Path, init: Path, name: str, changes: dict[str, Any]) -> Path:
    run = root / name
    if (run / ckpt.FINAL_DIR).exists():
        return run / ckpt.FINAL_DIR
    say(f"RL run {name}")
    fields = {**cfg.rl, **changes, "init": str(init), "env": cfg.env, "env_args": dict(cfg.env_args)}
    fields.setdefault("seed", cfg.seed)
    RLTrainer(run, RLConfig(**fields), resume=True).fit()
    render_rl(run)
    return run / ckpt.FINAL_DIR


def _env_factory(cfg: AgentRecipeConfig, horizon: int):
    return lambda: make_env(cfg.env, horizon=horizon, **cfg.env_args)


def evaluate(
    cfg: AgentRecipeConfig, root: Path, name: str, model_dir: Path, episodes: int, validation: bool = False
) -> list[dict]:
    """Held-out success by horizon on the test task seeds (cached in ``RUN/evals.json``), or with
    ``validation`` on the validation block (``RUN/val_evals.json``, episodes under ``RUN/val/``)."""
    path = root / (VAL_EVALS if validation else EVALS)
    offset = validation_offset(cfg.seed) if validation else cfg.seed
    done = json.loads(path.read_text()) if path.exists() else {}
    if name in done:
        return done[name]
    say(f"evaluating {name} ({episodes} episodes x {len(cfg.eval_horizons)} horizons)")
    rl_cfg = RLConfig(**{k: v for k, v in cfg.rl.items() if k in ("max_turn_tokens", "max_episode_tokens")})
    opts = {"max_batch": 64, "cache_budget_bytes": 4 << 30, "max_waiting": 1 << 16,
            "max_context": rl_cfg.max_episode_tokens + 1}  # fmt: skip
    cells = {(cfg.env, h): _env_factory(cfg, h) for h in cfg.eval_horizons}
    with Engine.from_dir(model_dir, **opts) as engine:
        results = run_local_eval(
            engine, cells, episodes, root / ("val" if validation else "evals") / name, seed=offset,
            max_tokens=rl_cfg.max_turn_tokens, temperature=cfg.eval_temperature,
        )  # fmt: skip
    done[name] = summarize(results, name)["by_horizon"]
    path.write_text(json.dumps(done, indent=1) + "\n")
    return done[name]


def rl_run_name(lr: float, seed: int, ablation: str | None = None) -> str:
    """The RL run's directory under RUN/: ``rl_lr<lr>_s<seed>`` (``rl_<ablation>_lr..`` for an ablation)."""
    return f"rl_{ablation + '_' if ablation else ''}lr{lr:g}_s{seed}"


def rl_model_name(seed: int, ablation: str | None = None) -> str:
    """The model's name in the evals: ``sft+rl`` (first seed), ``sft+rl#s<k>``, ``sft+rl:<ablation>``."""
    return "sft+rl" + (f":{ablation}" if ablation else "") + (f"#s{seed}" if seed else "")


def choose_rl_lr(cfg: AgentRecipeConfig, root: Path, tuned: Path) -> float:
    """The RL learning rate with the best pooled success on the validation task seeds (one run per
    candidate at the first seed); the only candidate when there is one. Test seeds play no part."""
    if len(cfg.rl_lrs) == 1:
        (root / RL_LR).write_text(json.dumps({"lr": cfg.rl_lrs[0], "validation_success": {}}) + "\n")
        return cfg.rl_lrs[0]
    scores = {}
    for lr in cfg.rl_lrs:
        path = rl(cfg, root, tuned, rl_run_name(lr, 0), {"lr": lr, "seed": cfg.seed})
        scores[lr] = pooled(evaluate(cfg, root, f"sft+rl@lr{lr:g}", path, cfg.val_episodes, validation=True))[
            0
        ]
    best = max(cfg.rl_lrs, key=lambda lr: scores[lr])
    say(f"RL lr on validation tasks: {scores} -> {best:g}")
    val = {str(k): v for k, v in scores.items()}
    (root / RL_LR).write_text(json.dumps({"lr": best, "validation_success": val}, indent=1) + "\n")
    return best


def open_recipe(cfg: C) -> tuple[C, Path]:
    """Create the run directory (one thread at least) and return ``(config, root)``: a resumed recipe
    keeps the settings it started with (``RECIPE_CONFIG``), a new one saves ``cfg`` there."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    root = Path(cfg.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    saved = root / RECIPE_CONFIG
    if saved.exists():
        return type(cfg).load(saved), root
    cfg.save(saved)
    return cfg, root


def run_recipe(
    cfg: AgentRecipeConfig, before_rl: Callable[[AgentRecipeConfig, Path], None] | None = None
) -> dict[str, Any]:
    """Run (or resume) every stage; returns the report's data. ``before_rl(cfg, run_dir)`` runs after
    SFT (``--jobs``: the RL runs in parallel processes, ``parallel.run_parallel``); the stages below
    then skip whatever it finished."""
    cfg, root = open_recipe(cfg)
    t0 = time.perf_counter()
    evals = {}  # each model is evaluated as soon as it exists, so a cut run still reports what it has
    base = pretrain(cfg, root)
    evals["pretrained"] = evaluate(cfg, root, "pretrained", base, cfg.eval_episodes)
    tuned = sft(cfg, root, base)
    evals["sft"] = evaluate(cfg, root, "sft", tuned, cfg.eval_episodes)
    if before_rl is not None:
        before_rl(cfg, root)
    lr = choose_rl_lr(cfg, root, tuned)
    for s in range(cfg.rl_seeds):
        path = rl(cfg, root, tuned, rl_run_name(lr, s), {"lr": lr, "seed": cfg.seed + s})
        evals[rl_model_name(s)] = evaluate(cfg, root, rl_model_name(s), path, cfg.eval_episodes)
    for name in cfg.ablations:
        for s in range(cfg.ablation_seeds):
            path = rl(cfg, root, tuned, f"{rl_run_name(lr, s, name)}", {**ABLATIONS[name], "lr": lr,
                                                                       "seed": cfg.seed + s})  # fmt: skip
            model = rl_model_name(s, name)
            evals[model] = evaluate(cfg, root, model, path, cfg.ablation_eval_episodes)
    say(f"done in {time.perf_counter() - t0:.0f} s; writing the report")
    return write_report(cfg, root, evals)


def report_so_far(cfg: AgentRecipeConfig) -> dict[str, Any]:
    """The report from ``RUN/evals.json`` as it stands (a run still going, or cut short)."""
    root = Path(cfg.run_dir)
    if (root / RECIPE_CONFIG).exists():
        cfg = AgentRecipeConfig.load(root / RECIPE_CONFIG)
    evals = json.loads((root / EVALS).read_text()) if (root / EVALS).exists() else {}
    return write_report(cfg, root, evals)
