"""The text-only control's own learning rate, chosen on validation pages (never on test pages).

Each candidate of ``rc.control_lrs`` trains the control (``rc.control_inputs``) for
``rc.control_search_steps`` steps (0: the control's full budget) into ``OUT/control_search/lr<lr>/``
and is scored (pooled field F1, greedy decoding) on ``rc.val_n`` renders of the target family drawn from the
VALIDATION seed block (``longmoe.envs.seeds``: ``[2·10⁹, 3·10⁹)``, disjoint from the training seeds
below 10⁹ and the test pages from 10⁹ on). The best F1 wins.
Ties (every candidate at F1 0 early in training) go to the lower teacher-forced validation loss.
When the search ran the full budget, the chosen candidate is the control itself; otherwise the
control is trained again at the chosen lr. The choice is stored in ``OUT/control_lr.json``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import torch

from longmoe.data.tokenizer import Tokenizer
from longmoe.envs.seeds import validation_offset
from longmoe.model import LongMoE
from longmoe.pipelines.vision_extract.config import VisionExtractConfig
from longmoe.pipelines.vision_extract.data import collate, make_rows
from longmoe.pipelines.vision_extract.result import TrainRun
from longmoe.pipelines.vision_extract.train import pooled_f1, train_extractor
from longmoe.tasks.documents import held_out_seeds, render

CHOICE_FILE = "control_lr.json"
SEARCH_DIR = "control_search"


def validation_seeds(rc: VisionExtractConfig) -> range:
    """The render seeds of the lr choice: the validation block, never a training or test page."""
    return held_out_seeds(rc.val_n, validation_offset(0))


def validation_docs(rc: VisionExtractConfig) -> list:
    """``val_n`` validation renders of each of ``rc.validation_families()``."""
    return [render(f, s) for f in rc.validation_families() for s in validation_seeds(rc)]


@torch.no_grad()
def validation_loss(model: LongMoE, tok: Tokenizer, rc: VisionExtractConfig, inputs: str) -> float:
    """Teacher-forced loss (nats per JSON token) on the validation pages: breaks F1 ties (all 0 early)."""
    docs = validation_docs(rc)
    was = model.training
    model.eval()
    b = collate(*make_rows(docs, tok, model, inputs), pad_id=tok.pad_id)
    emb = model.encode_images(b.images) if b.images else None
    loss = float(model(b.input_ids, labels=b.labels, image_embeds=emb).ce_loss)
    model.train(was)
    return loss


def validation_f1(model: LongMoE, tok: Tokenizer, rc: VisionExtractConfig, inputs: str) -> float:
    return pooled_f1(model, tok, validation_docs(rc), inputs)


def train_control(
    rc: VisionExtractConfig, tok: Tokenizer, out: Path, log: Callable[[str], None] = print
) -> tuple[LongMoE, TrainRun, dict]:
    """The lr search, then the control at the chosen lr: ``(model, run, choice)``."""
    inputs, budget = rc.control_inputs, rc.control_steps or rc.steps
    lrs = rc.control_lrs or [rc.lr]
    search = rc.control_search_steps or budget
    f = out / CHOICE_FILE
    choice = json.loads(f.read_text()) if f.is_file() else None
    models: dict[float, tuple[LongMoE, TrainRun]] = {}
    if choice is None:
        cands = []
        for lr in lrs:
            crc = dataclasses.replace(rc, lr=lr, control_steps=search)
            d = out / SEARCH_DIR / f"lr{lr:g}"
            model, run = train_extractor(crc, tok, d, inputs, lambda m, lr=lr: log(f"lr {lr:g}: {m}"))
            val, vloss = validation_f1(model, tok, rc, inputs), validation_loss(model, tok, rc, inputs)
            rel = str(d.relative_to(out))
            cands.append({"lr": lr, "val_f1": round(val, 4), "val_loss": round(vloss, 4), "dir": rel})
            models[lr] = (model, run)
            log(f"control lr {lr:g}: validation F1 {val:.3f}, loss {vloss:.3f} "
                f"({rc.val_n} pages of {', '.join(rc.validation_families())})")  # fmt: skip
        best = max(cands, key=lambda c: (c["val_f1"], -c["val_loss"]))
        choice = {"inputs": inputs, "candidates": cands, "lr": best["lr"], "search_steps": search,
                  "budget": budget, "val_n": rc.val_n, "val_family": ", ".join(rc.validation_families()),
                  "val_seeds": [validation_seeds(rc).start, validation_seeds(rc).stop]}  # fmt: skip
        f.write_text(json.dumps(choice, indent=2) + "\n")
    lr = choice["lr"]
    if search == budget:  # the chosen candidate already had the full budget: it is the control
        d = out / next(c["dir"] for c in choice["candidates"] if c["lr"] == lr)
        model, run = models.get(lr) or train_extractor(
            dataclasses.replace(rc, lr=lr, control_steps=budget), tok, d, inputs, log
        )
    else:
        crc = dataclasses.replace(rc, lr=lr, control_steps=budget)
        model, run = train_extractor(crc, tok, out / "control", inputs, log)
    return model, run, choice
