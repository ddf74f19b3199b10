"""The ablation's run: equal-size models per pattern, their training, their evaluation.

Every step resumes: the tokenizer (``OUT/tokenizer.json``), each pattern's training (checkpoints, then
``pattern-P/recipe_done.json``) and evaluation (``pattern-P/eval/``: grid results, loss by position,
answer losses) are read back instead of redone when their files exist.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import defaultdict
from pathlib import Path

import torch

from longmoe.checkpoint import METRICS
from longmoe.config import ModelConfig
from longmoe.data.stages import CurriculumStage
from longmoe.data.tokenizer import TOKENIZER_FILE, Tokenizer
from longmoe.eval.clients import LocalClient
from longmoe.eval.longctx import runner
from longmoe.eval.plots import plot_run
from longmoe.eval.ppl import answer_loss, ppl_by_position
from longmoe.model import LongMoE
from longmoe.pipelines.longctx_tiny.checks import expected_checks
from longmoe.pipelines.longctx_tiny.config import RecipeConfig
from longmoe.pipelines.longctx_tiny.report import write_report
from longmoe.pipelines.longctx_tiny.result import AnswerLoss, EvalResult, RecipeResult, TrainResult
from longmoe.presets import preset
from longmoe.runlog import read_jsonl
from longmoe.train.config import TrainConfig
from longmoe.train.mix import SYNTHETIC_TASKS
from longmoe.train.pretrain import Trainer
from longmoe.train.run import train_tokenizer

DONE_FILE = "recipe_done.json"
CONFIG_OUT = "recipe_config.json"


def pattern_dir(out: Path, pattern: str) -> Path:
    return out / f"pattern-{pattern}"


# ---------------------------------------------------------------------- models of equal size
def n_params(cfg: ModelConfig) -> int:
    return LongMoE(cfg).num_parameters()


def model_config(rc: RecipeConfig, pattern: str, target: int | None = None) -> ModelConfig:
    """The preset with ``pattern``; with ``target``, the first dense FFN resized to match it."""
    cfg = preset(rc.preset).replace(layer_pattern=pattern, max_seq_len=rc.window)
    if target is None:
        return cfg
    if cfg.ffn.kind == "moe" and cfg.ffn.first_k_dense < 1:
        raise ValueError("matching parameter counts needs a dense first FFN (ffn.first_k_dense >= 1)")
    n = n_params(cfg)
    per_unit = 3 * cfg.d_model * max(1, cfg.ffn.first_k_dense if cfg.ffn.kind == "moe" else cfg.n_layers)
    guess = cfg.ffn.dense_hidden + round((target - n) / per_unit)
    best = min(
        (max(8, guess + k) for k in range(-3, 4)),
        key=lambda h: abs(n_params(cfg.replace(ffn=dataclasses.replace(cfg.ffn, dense_hidden=h))) - target),
    )
    return cfg.replace(ffn=dataclasses.replace(cfg.ffn, dense_hidden=best))


# ---------------------------------------------------------------------- training
def load_tokenizer(rc: RecipeConfig, out: Path) -> Tokenizer:
    """The run's tokenizer: ``OUT/tokenizer.json``, trained on the corpus the first time."""
    tok_file = out / TOKENIZER_FILE
    if tok_file.is_file():
        return Tokenizer.from_file(tok_file)
    print(f"training a {rc.tokenizer_vocab}-token BPE on {rc.tokenizer_chars:,} characters of the corpus")
    tok = train_tokenizer(rc.tokenizer_vocab, max_chars=rc.tokenizer_chars)
    tok.save(tok_file)
    return tok


def train_config(rc: RecipeConfig) -> TrainConfig:
    synth = "synthetic"  # every family; a subset is named 'synthetic:<task>+<task>'
    if set(rc.synthetic_tasks) != set(SYNTHETIC_TASKS):
        synth = "synthetic:" + "+".join(rc.synthetic_tasks)
    mix = {"file": 1.0 - rc.synthetic_share, synth: rc.synthetic_share}
    if rc.synthetic_share == 0:
        mix = {"file": 1.0}
    short_tokens = int(rc.tokens * rc.short_docs_fraction)
    if rc.synthetic_share == 0 or short_tokens < rc.batch_size * rc.window:
        short_tokens = 0  # no task documents, or a stage too small to hold one batch

    def stage(name: str, tokens: int, rng: list[float]) -> CurriculumStage:
        return CurriculumStage(
            name,
            window=rc.window,
            tokens=tokens,
            batch_size=rc.batch_size,
            mix=mix,
            synthetic_loss=rc.synthetic_loss,
            synthetic_length=list(rng),
        )

    stages = [stage("short-docs", short_tokens, rc.short_docs_length)] if short_tokens else []
    stages.append(stage("full", rc.tokens - short_tokens, rc.synthetic_length))
    steps = sum(s.steps for s in stages)
    return TrainConfig(
        stages=stages,
        lr=rc.lr,
        warmup_steps=min(rc.warmup_steps, max(1, steps // 10)),
        seed=rc.seed,
        eval_every=0,
        ckpt_every=max(10, min(steps // 4, 200)),  # a killed long run loses at most ~200 steps
        keep_last=1,
    )


def train_one(
    rc: RecipeConfig, cfg: ModelConfig, tok: Tokenizer, run_dir: Path, progress: bool = True
) -> TrainResult:
    """Train (or resume, or skip when finished) one pattern's run."""
    done = run_dir / DONE_FILE
    if done.is_file():
        return TrainResult.from_dict(json.loads(done.read_text()))
    trainer = Trainer(run_dir, cfg, train_config(rc), tok, resume=True, progress=progress)
    result = TrainResult(**trainer.fit(), params=trainer.model.num_parameters(), **last_losses(run_dir))
    done.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def last_losses(run_dir: Path) -> dict[str, float | None]:
    """Mean train loss over the last 10 logged steps and the last validation loss of a run."""
    f = run_dir / METRICS
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
    train = [r["loss"] for r in rows if "loss" in r][-10:]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return {
        "train_loss_last10": sum(train) / len(train) if train else None,
        "val_loss": val[-1] if val else None,
    }


# ---------------------------------------------------------------------- evaluation
def eval_one(rc: RecipeConfig, run_dir: Path, progress: bool = True) -> EvalResult:
    """Task grid at ``eval_multiples`` x window, and loss by position up to the largest multiple."""
    out = run_dir / "eval"
    client = LocalClient(run_dir)
    lengths = rc.eval_lengths
    depths = runner.parse_depths(rc.eval_depths)
    grid = runner.build_grid(rc.eval_tasks, lengths, depths, rc.eval_n, rc.eval_seed, client.tokenizer)
    runner.run_grid(client, grid, out, client.tokenizer, batch_size=8, progress=progress)
    client.close()
    summary = runner.write_summary(out)
    ppl_file, nll_file = out / "ppl.json", out / "answer_nll.json"
    if not ppl_file.is_file() or not nll_file.is_file():
        model, tok = client.engine.model, client.tokenizer  # the weights the grid was scored with
        with torch.no_grad():
            if not ppl_file.is_file():
                res = ppl_by_position(model, tok, max(lengths), rc.window, rc.ppl_docs, bucket=rc.window // 4)
                ppl_file.write_text(json.dumps(res, indent=2) + "\n")
            if not nll_file.is_file():
                rows = [dataclasses.asdict(a) for a in answer_nll_table(model, tok, grid)]
                nll_file.write_text(json.dumps(rows, indent=2) + "\n")
    plot_run(out)
    return EvalResult(
        by_length=summary["by_length"],
        by_variant=summary["by_variant"],
        ppl=json.loads(ppl_file.read_text()),
        answer_nll=[AnswerLoss(**a) for a in json.loads(nll_file.read_text())],
        predictions=[r["prediction"].strip() for r in read_jsonl(out / runner.RESULTS_FILE)],
    )


def answer_nll_table(model: LongMoE, tok: Tokenizer, grid: list[runner.GridItem]) -> list[AnswerLoss]:
    """Mean teacher-forced answer loss per (task, variant, length) over the grid's items."""
    groups: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for g in grid:
        nll = answer_loss(model, tok, g.item.prompt(), g.item.answer_text())
        groups[(g.task, g.item.metadata["variant"], g.length)].append(nll)
        groups[(g.task, "*", g.length)].append(nll)
    return [AnswerLoss(t, v, n, len(xs), sum(xs) / len(xs)) for (t, v, n), xs in sorted(groups.items())]


# ---------------------------------------------------------------------- the whole ablation
def run_recipe(
    rc: RecipeConfig, out: Path, progress: bool = True, skip_eval: bool = False
) -> RecipeResult | None:
    """Train and evaluate every pattern in turn, then write the report; ``None`` with ``skip_eval``."""
    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(rc, out)
    rc.save(out / CONFIG_OUT)
    target = n_params(model_config(rc, rc.reference_pattern))
    cfgs = {p: model_config(rc, p, target) for p in rc.patterns}  # every pattern at the reference's size
    for p, c in cfgs.items():
        n = n_params(c)
        print(
            f"pattern {p}: {n:,} parameters ({(n - target) / target:+.3%} vs {rc.reference_pattern}), "
            f"dense_hidden {c.ffn.dense_hidden}"
        )
    trained, evals = {}, {}
    for p, cfg in cfgs.items():
        run_dir = pattern_dir(out, p)
        t0 = time.time()
        trained[p] = train_one(rc, cfg, tok, run_dir, progress=progress)
        print(f"pattern {p}: trained {trained[p].tokens:,} tokens ({time.time() - t0:.0f} s this run)")
        if not skip_eval:
            t0 = time.time()
            evals[p] = eval_one(rc, run_dir, progress=progress)
            print(f"pattern {p}: evaluated in {time.time() - t0:.0f} s")
    if not evals:
        return None
    result = RecipeResult(rc, trained, evals, expected_checks(rc, evals))
    print(write_report(result, out))
    return result
