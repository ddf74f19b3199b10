"""The recipe: train the image extractor, evaluate it on held-out renders of every family, the same for
the text-only control (its lr chosen on validation pages), the interleaved-pretraining check, then the
report.

Every stage leaves files a rerun reads instead of redoing it: ``OUT/main`` and ``OUT/control`` (a
checkpoint while training, then a model directory and ``run.json``), ``OUT/<run>/eval/`` (the
extraction results, one JSON line per document, resumable), ``OUT/pretrain_check.json``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from longmoe.data.tokenizer import Tokenizer
from longmoe.eval.extract.harness import RESULTS_FILE, run_extract
from longmoe.eval.extract.local import ModelExtractClient
from longmoe.model import LongMoE
from longmoe.pipelines.vision_extract.config import VisionExtractConfig
from longmoe.pipelines.vision_extract.control import train_control
from longmoe.pipelines.vision_extract.data import char_tokenizer
from longmoe.pipelines.vision_extract.errors import classify_run
from longmoe.pipelines.vision_extract.report import write_report
from longmoe.pipelines.vision_extract.result import Example, VisionExtractResult
from longmoe.pipelines.vision_extract.train import pretrain_check, train_extractor
from longmoe.report.provenance import git_commit, provenance
from longmoe.runlog import read_jsonl
from longmoe.tasks.documents import render

CONFIG_OUT = "config.json"
EXAMPLES_DIR = "examples"
EXAMPLES_PER_FAMILY = 3


def evaluate(
    model: LongMoE,
    tok: Tokenizer,
    rc: VisionExtractConfig,
    out: Path,
    inputs: str,
    log: Callable[[str], None],
) -> dict[str, dict]:
    """Held-out extraction per family (``rc.eval_count`` renders each); returns the summary cells."""
    client = ModelExtractClient(model, tok, inputs, name=out.name)
    cells = {}
    for fam in rc.eval_families:  # one family at a time: each gets its own count of held-out seeds
        s = run_extract(client, [fam], rc.eval_count(fam), out / "eval", batch_size=64,
                        count_tokens=lambda t: len(tok.encode(t)), log=lambda _m: None)  # fmt: skip
        cells[fam] = s["families"][fam]
        log(f"{out.name}: {fam}: field F1 {cells[fam]['micro_f1']:.3f} (n={cells[fam]['n']})")
    return cells


def pick_examples(out: Path, rc: VisionExtractConfig) -> list[Example]:
    """A few held-out documents per family from the main model's results (worst first, then best),
    their images saved under ``OUT/examples/`` for the report's figure."""
    rows = read_jsonl(out / "main" / "eval" / RESULTS_FILE)
    (out / EXAMPLES_DIR).mkdir(parents=True, exist_ok=True)
    exs = []
    for fam in rc.eval_families:
        rs = sorted((r for r in rows if r["family"] == fam), key=lambda r: (r["f1"], r["seed"]))
        chosen = (rs[:1] + rs[-(EXAMPLES_PER_FAMILY - 1) :]) if len(rs) >= EXAMPLES_PER_FAMILY else rs
        for r in chosen:
            name = f"{fam}_{r['seed']}.png"
            render(fam, r["seed"]).image.save(out / EXAMPLES_DIR / name)
            exs.append(Example(fam, r["id"], r["target"], r["prediction"], round(r["f1"], 4), name))
    return exs


STAGES = ("main", "control")


def _stage_done(out: Path, stage: str, started: float, commit: str | None) -> None:
    """``OUT/provenance.<stage>.json``: the commit the stage started from, its wall and CPU time."""
    p = provenance(" ".join(sys.argv), started, commit)
    (out / f"provenance.{stage}.json").write_text(json.dumps(p, indent=2) + "\n")


def run(
    rc: VisionExtractConfig, out: Path, log: Callable[[str], None] = print, stage: str | None = None
) -> VisionExtractResult | None:
    """The whole recipe; ``stage`` "main" trains and evaluates the image model only, "control" the
    text control and the pretraining check (two processes can then run the stages side by side; a
    later run without a stage reads their files and finishes the recipe) and returns None."""
    if stage is not None and stage not in STAGES:
        raise ValueError(f"stage={stage!r} is invalid: expected one of {STAGES}")
    started, commit = time.perf_counter(), git_commit()
    out.mkdir(parents=True, exist_ok=True)
    rc.save(out / CONFIG_OUT if stage is None else out / f"config.{stage}.json")
    tok = char_tokenizer()
    main_eval = None
    if stage in (None, "main"):
        log(f"vision_extract: main model (images), {rc.steps} steps of {rc.batch_size} on {rc.mix}")
        model, main = train_extractor(rc, tok, out / "main", "image", log)
        main_eval = evaluate(model, tok, rc, out / "main", "image", log)
    control = control_eval = None
    choice = None
    if rc.text_control and stage in (None, "control"):
        steps = rc.control_steps or rc.steps
        log(f"vision_extract: text-only control ({rc.control_inputs}, {steps} steps, lr chosen from "
            f"{rc.control_lrs or [rc.lr]} on validation pages)")  # fmt: skip
        cmodel, control, choice = train_control(rc, tok, out, log)
        control_eval = evaluate(cmodel, tok, rc, out / "control", rc.control_inputs, log)
    if stage == "main":
        return _stage_done(out, stage, started, commit)
    pre = None
    if rc.pretrain_check:
        log(f"vision_extract: interleaved-pretraining check ({rc.pretrain_steps} steps x 2)")
        pre = pretrain_check(rc, tok, out, log)
    if stage == "control":
        return _stage_done(out, stage, started, commit)
    assert main_eval is not None
    result = VisionExtractResult(
        main=main, main_eval=main_eval, control=control, control_eval=control_eval, pretrain=pre,
        examples=pick_examples(out, rc), control_lr=choice, target_f1=rc.target_f1,
        target_family=rc.target_family, target_families=rc.target_families,
        errors=classify_run(out / "main", rc.vision_config()),
    )  # fmt: skip
    (out / "results.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    write_report(result, rc, out)
    return result
