"""The demo run: tokenizer → tiny hybrid MoE model → 3-stage curriculum → eval → sample → recall →
report.

The curriculum (256 → 1K → 4K, replay + synthetic long-context documents) trains on the embedded
standard-library corpus; validation loss is measured at every stage's window and at twice the last
one. The report states the loss of a unigram model of the same corpus beside the model's, so "it
learned" is a number, not a claim. Then a 2-layer hybrid is trained on associative recall (MQAR,
``recall.py``) and tested at 1x/4x/16x its training length: what the architecture is for, measured.
``--resume`` continues an interrupted run from its checkpoint.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from longmoe.checkpoint import FINAL_DIR
from longmoe.config import IGNORE_INDEX
from longmoe.data.corpus import corpus_texts
from longmoe.data.stages import tiny_curriculum
from longmoe.data.tokenizer import Tokenizer
from longmoe.pipelines.demo.config import DemoConfig
from longmoe.pipelines.demo.recall import run_recall
from longmoe.pipelines.demo.report import render_report
from longmoe.pipelines.demo.result import DemoResult, LengthEval, Sample, StageResult
from longmoe.presets import preset
from longmoe.report.provenance import provenance
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from longmoe.train.config import TrainConfig
from longmoe.train.plots import render
from longmoe.train.pretrain import Trainer
from longmoe.train.run import is_resumed, train_tokenizer

REPORT_JSON = "report.json"
REPORT_MD = "report.md"


def unigram_loss(tok: Tokenizer, labels: torch.Tensor, max_chars: int = 5_000_000) -> float:
    """Cross-entropy (nats/token) on ``labels`` of a unigram model fit on the train split (add-one)."""
    counts: Counter[int] = Counter()
    for text in corpus_texts(None, "train", max_chars):
        counts.update(tok.encode(text))
        counts[tok.eos_id] += 1  # every document ends with one, as in packing
    total = sum(counts.values()) + tok.vocab_size
    y = labels[labels != IGNORE_INDEX].tolist()
    return -sum(math.log((counts.get(t, 0) + 1) / total) for t in y) / len(y)


def sample(model_dir: Path, prompt: str, max_tokens: int = 96) -> str:
    """A seeded sampled continuation of ``prompt`` through the serving engine."""
    eng = Engine.from_dir(model_dir)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.7, top_p=0.9, seed=0)
    return eng.generate(prompt, params).text


def _trainer(cfg: DemoConfig) -> Trainer:
    """A resumed trainer when asked for and there is a run to resume; else a new run."""
    if is_resumed(cfg.run_dir, cfg.resume):
        return Trainer(cfg.run_dir, resume=True, progress=cfg.progress)
    mcfg = preset("tiny")
    print(f"[demo] training a {mcfg.vocab_size}-token BPE tokenizer on the embedded corpus", file=sys.stderr)
    tok = train_tokenizer(mcfg.vocab_size)
    tcfg = TrainConfig(
        stages=tiny_curriculum(cfg.scale, synthetic=cfg.synthetic),
        seed=cfg.seed,
        eval_every=0,
        ckpt_every=cfg.ckpt_every,
        val_windows=cfg.val_windows,
    )
    return Trainer(cfg.run_dir, mcfg, tcfg, tok, progress=cfg.progress)


def run_demo(cfg: DemoConfig) -> DemoResult:
    """Train, evaluate, sample; writes ``report.json``, ``report.md`` and the plots into ``run_dir``."""
    t0, started = time.time(), time.perf_counter()
    trainer = _trainer(cfg)
    n_params = trainer.model.num_parameters()
    print(f"[demo] tiny hybrid MoE: {n_params:,} parameters; {trainer.total_steps} steps", file=sys.stderr)
    summary = trainer.fit()
    t_train = time.time() - t0

    windows = sorted({s.window for s in trainer.tcfg.stages})
    evals = []
    for n in windows + [2 * windows[-1]]:  # every stage's window, and twice the longest
        loss = trainer.evaluate(n)
        uni = unigram_loss(trainer.tok, torch.cat([b.labels for b in trainer.val_cache[n]], 1))
        evals.append(LengthEval(n, loss, uni, beyond_training=n > windows[-1]))
        print(f"[demo] val loss @ {n}: {loss:.3f}  (unigram {uni:.3f})", file=sys.stderr)
    completion = sample(cfg.run_dir / FINAL_DIR, cfg.sample_prompt, cfg.sample_tokens)
    recall = None
    if cfg.recall:
        print("[demo] training a 2-layer hybrid (KDA + MLA) on associative recall (MQAR)", file=sys.stderr)
        recall = run_recall(cfg)
        accs = ", ".join(f"{n} tokens {a:.3f}" for n, a in recall.accuracy.items())
        print(f"[demo] recall accuracy after {recall.steps} steps: {accs}", file=sys.stderr)
    result = DemoResult(
        params=n_params,
        steps=summary["steps"],
        tokens=summary["tokens"],
        train_seconds=round(t_train, 1),
        synthetic_documents=any(k.startswith("synthetic") for s in trainer.tcfg.stages for k in s.mix),
        stages=[
            StageResult(
                s.name, s.window, s.tokens, s.replay_fraction, summary["val_loss_at_stage_end"].get(s.name)
            )
            for s in trainer.tcfg.stages
        ],
        eval=evals,
        sample=Sample(cfg.sample_prompt, completion),
        plots=[p.name for p in render(cfg.run_dir)],
        recall=recall,
    )
    record = {**result.to_dict(), "provenance": provenance(" ".join(["longmoe", *sys.argv[1:]]), started)}
    (cfg.run_dir / REPORT_JSON).write_text(json.dumps(record, indent=2) + "\n")
    (cfg.run_dir / REPORT_MD).write_text(render_report(result))
    print(f"[demo] wrote {cfg.run_dir / REPORT_MD} in {time.time() - t0:.0f} s")
    return result
