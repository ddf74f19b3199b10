"""The ablation runs: one ``Trainer`` run per (study, arm, seed), saved as ``OUT/<study>/<arm>-seed<s>.json``.

A rerun reads every finished run's JSON instead of training it again (unless it was trained with other
settings: the file's ``spec`` must equal the run's); an interrupted run restarts from its first step.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from longmoe.checkpoint import METRICS
from longmoe.data.stages import CurriculumStage
from longmoe.data.tokenizer import TOKENIZER_FILE, Tokenizer
from longmoe.pipelines.ablations.config import HOT_LR_SCALE, AblationConfig, RunKey, run_keys
from longmoe.pipelines.ablations.models import model_for
from longmoe.pipelines.ablations.probes import DecayProbe
from longmoe.pipelines.ablations.report import write_report
from longmoe.pipelines.ablations.result import RunResult
from longmoe.runlog import read_metrics_lines
from longmoe.train.config import TrainConfig
from longmoe.train.pretrain import Trainer
from longmoe.train.run import train_tokenizer

CONFIG_OUT = "ablation_config.json"


def load_tokenizer(cfg: AblationConfig, out: Path) -> Tokenizer:
    """The runs' shared BPE: ``OUT/tokenizer.json``, trained on the embedded corpus the first time."""
    f = out / TOKENIZER_FILE
    if f.is_file():
        return Tokenizer.from_file(f)
    tok = train_tokenizer(cfg.tokenizer_vocab, max_chars=cfg.tokenizer_chars)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(f)
    return tok


def result_path(out: Path, key: RunKey) -> Path:
    return out / key.study / f"{key.name}.json"


def train_config(key: RunKey, cfg: AblationConfig) -> TrainConfig:
    """Same tokens for every arm of a study: ``steps`` batches of ``batch_size`` windows; the decay study
    trains in bf16 autocast (the setting whose stability is in question), the others in fp32; ``-hot``
    arms at ``HOT_LR_SCALE`` times the learning rate."""
    steps = cfg.steps(key.study)
    stage = CurriculumStage(
        key.study, cfg.window, steps * cfg.window * cfg.batch_size, batch_size=cfg.batch_size
    )
    lr = cfg.lr * (HOT_LR_SCALE if key.arm.endswith("-hot") else 1.0)
    return TrainConfig(
        stages=[stage], lr=lr, warmup_steps=cfg.warmup_steps, bf16=key.study == "decay", seed=key.seed,
        eval_every=0, ckpt_every=0, keep_last=1, val_windows=cfg.val_windows,
    )  # fmt: skip


def spec(key: RunKey, cfg: AblationConfig, vocab: int) -> dict[str, Any]:
    """Everything the run's numbers depend on (a stored run with another spec is retrained)."""
    d = {
        "model": model_for(key, cfg, vocab).to_dict(),
        "train": train_config(key, cfg).to_dict(),
        "settle_steps": cfg.settle_steps,
    }
    return json.loads(json.dumps(d))  # as a stored file reads back (lists, not tuples)


def train_run(
    key: RunKey, cfg: AblationConfig, tok: Tokenizer, out: Path, progress: bool = False
) -> RunResult:
    """Train one run from scratch with ``Trainer`` and measure it (see ``RunResult``)."""
    run_dir = out / key.study / "runs" / key.name
    if run_dir.exists():  # an interrupted run: start it over (its JSON is what marks it finished)
        shutil.rmtree(run_dir)
    t0 = time.perf_counter()
    trainer = Trainer(
        run_dir, model_for(key, cfg, tok.vocab_size), train_config(key, cfg), tok, progress=progress
    )
    probe = DecayProbe(trainer.model) if key.study == "decay" else None
    diverged = False
    try:
        trainer.fit()
    except FloatingPointError:  # too many non-finite gradients in a row: the instability measured
        diverged = True
    finally:
        if probe is not None:
            probe.close()
    recs = [json.loads(line) for line in read_metrics_lines(run_dir / METRICS)]
    val = next((r["val_loss"] for r in reversed(recs) if "val_loss" in r), None)
    if val is None:  # a diverged run never reached the stage-end evaluation
        val = trainer.evaluate(cfg.window)
    losses = [float(r["loss"]) for r in recs]
    vio = [statistics.mean(r["max_vio"]) for r in recs if r.get("max_vio")]
    last = recs[-1] if recs else {}
    moe = bool(last.get("max_vio"))
    return RunResult(
        study=key.study,
        arm=key.arm,
        seed=key.seed,
        spec=spec(key, cfg, tok.vocab_size),
        params=trainer.model.num_parameters(),
        steps=trainer.step,
        tokens=trainer.tokens,
        seconds=round(time.perf_counter() - t0, 1),
        val_loss=float(val),
        loss_curve=losses,
        skipped_steps=trainer.skipped_steps,
        nonfinite_loss_steps=sum(not math.isfinite(x) for x in losses),
        diverged=diverged,
        min_gamma=[] if probe is None else probe.min_gamma,
        max_abs_o=[] if probe is None else probe.max_abs_o,
        max_vio_curve=vio,
        final_max_vio=statistics.mean(vio[-cfg.settle_steps :]) if moe else None,
        dead_experts=sum(last["dead_experts"]) if moe else None,
        router_entropy=statistics.mean(last["router_entropy"]) if moe else None,
    )


def load_or_train(
    key: RunKey, cfg: AblationConfig, tok: Tokenizer, out: Path, progress: bool = False
) -> tuple[RunResult, bool]:
    """The run's stored result when it was trained with this spec, else a fresh one (saved);
    returns ``(result, trained_now)``."""
    f = result_path(out, key)
    if f.is_file():
        stored = RunResult.from_dict(json.loads(f.read_text()))
        if stored.spec == spec(key, cfg, tok.vocab_size):
            return stored, False
        print(f"[ablations] {key.study}/{key.name}: settings changed, retraining")
    result = train_run(key, cfg, tok, out, progress)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict()) + "\n")
    tmp.replace(f)  # atomic: a killed run never leaves a half-written result that would be skipped
    return result, True


def run_ablations(
    cfg: AblationConfig, out: Path, progress: bool = False, report: bool = True
) -> list[RunResult]:
    """Train (or read back) every run of ``cfg.studies``; writes ``OUT/report.md`` and the figures."""
    out.mkdir(parents=True, exist_ok=True)
    (out / CONFIG_OUT).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    tok = load_tokenizer(cfg, out)
    results = []
    for key in run_keys(cfg):
        r, fresh = load_or_train(key, cfg, tok, out, progress)
        if fresh:
            print(
                f"[ablations] {key.study}/{key.name}: val {r.val_loss:.4f}, non-finite {r.nonfinite_events}, "
                f"{r.seconds:.0f} s",
                flush=True,
            )
        results.append(r)
    if report:
        write_report(cfg, results, out)
    return results
