"""Training loops of the recipe: the extractor (image or text inputs) and the pretraining check.

The extractor resumes: every ``checkpoint_every`` steps the run's ``Checkpointer``
(``train/checkpointer.py``) writes ``OUT/<run>/checkpoints/step-N/`` (model, optimiser, schedule,
RNG, step, the curve and the seconds spent so far; atomic, the layout every longmoe run has), and a
finished extractor is a model directory ``OUT/<run>/model`` that ``longmoe eval --tasks extract
--model`` reads. A run directory from before the checkpointer (its ``OUT/<run>/ckpt.pt``, loaded as
data with ``weights_only=True``) resumes from that file. Batches are pure functions of the step, so
a resumed run sees the batches it would have seen. The pretraining check keeps each finished arm in
``pretrain_check.partial.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from longmoe.checkpoint import CKPT_DIR, is_model_dir, load_model, save_model_dir
from longmoe.config import IGNORE_INDEX
from longmoe.data.corpus import stdlib_files, stdlib_root
from longmoe.data.tokenizer import TOKENIZER_FILE, Tokenizer
from longmoe.distributed.parallel_dims import ParallelDims
from longmoe.eval.extract.harness import score_answer
from longmoe.eval.extract.local import decode_documents
from longmoe.model import LongMoE
from longmoe.pipelines.vision_extract.config import VisionExtractConfig
from longmoe.pipelines.vision_extract.data import Batch, train_batch
from longmoe.pipelines.vision_extract.result import PretrainCheck, TrainRun
from longmoe.tasks.documents import held_out_seeds, render
from longmoe.train.checkpointer import RNG, Checkpointer, Progress
from longmoe.train.optim import LRSchedule, ScheduleConfig, build_optimizer
from longmoe.train.parallel import SingleProcess
from longmoe.train.rng import seed_everything

CONTROL_PATCH = 8  # the text controls' grid cell: a one-hot code of 3 * 8 * 8 entries
CURVE_OFFSET = 50_000_000  # held-out block of the training curve (the final evaluation uses offset 0)
GRAD_CLIP = 1.0
RECIPE_BETAS = (0.9, 0.98)
LEGACY_CKPT = "ckpt.pt"  # format 0: a run directory from before the checkpointer
MODEL_DIR = "model"
RUN_FILE = "run.json"


def build_model(rc: VisionExtractConfig, vision: bool = True) -> LongMoE:
    seed_everything(rc.seed)
    return LongMoE(rc.model_config(vision=vision))


def control_config(rc: VisionExtractConfig) -> VisionExtractConfig:
    """A text control's model settings: its grid cells are character codes, not pixels, so its
    encoder is the linear projector (a character embedding) on 8-px "patches" (192 code slots:
    ``textgrid`` gives every character from 0 to 190 its own) on a ``control_grid``-cell square,
    whatever the image model reads with."""
    return dataclasses.replace(
        rc, encoder="linear", patch_size=CONTROL_PATCH, max_image_side=rc.control_grid * CONTROL_PATCH
    )


class Curve:
    """A checkpoint part: the training curve so far, the wall seconds and the CPU seconds (this
    process's, all threads) it took (a resumed run's time adds to the earlier runs')."""

    def __init__(self) -> None:
        self.points: list[list[float]] = []
        self.t0 = time.perf_counter()
        self.c0 = time.process_time()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def cpu_seconds(self) -> float:
        return time.process_time() - self.c0

    def state_dict(self) -> dict[str, Any]:
        return {"curve": self.points, "seconds": self.seconds, "cpu_seconds": self.cpu_seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = [list(p) for p in state["curve"]]
        self.t0 = time.perf_counter() - float(state["seconds"])
        self.c0 = time.process_time() - float(state.get("cpu_seconds", 0.0))


def _resume(out: Path, cp: Checkpointer, model: LongMoE, opt: torch.optim.Optimizer, curve: Curve) -> bool:
    """Restore the newest checkpoint, else a ``ckpt.pt`` written before the checkpointer (format 0:
    model, optimiser, step, curve, seconds); False when there is neither."""
    if cp.restore() is not None:
        return True
    if not (out / LEGACY_CKPT).is_file():
        return False
    st = torch.load(out / LEGACY_CKPT, weights_only=True)  # tensors and plain containers: no code runs
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    cp.progress.step = int(st["step"])
    cp.parts["schedule"].load_state_dict({"step": int(st["step"])})
    curve.load_state_dict(st)
    return True


def reading_loss(model: LongMoE, emb: torch.Tensor, reads: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each patch embedding ``emb`` ``[N, d]``, read through the model's head,
    against its reading targets ``reads`` ``[N, vocab]`` (``data.reading_targets``), mean over patches."""
    return -(reads * model.token_logits(emb).float().log_softmax(-1)).sum(-1).mean()


def _step(
    model: LongMoE, opt: torch.optim.Optimizer, b: Batch, read_weight: float = 0.0
) -> tuple[float, float]:
    """One optimiser step on the answer loss (+ ``read_weight`` × the patch-reading loss where the
    batch has images): ``(answer loss, reading loss or nan)``."""
    emb = model.encode_images(b.images) if b.images else None
    out = model(b.input_ids, labels=b.labels, image_embeds=emb)
    loss, read = out.ce_loss, None
    if read_weight > 0 and emb is not None and b.reads is not None:
        read = reading_loss(model, emb, b.reads)
        loss = loss + read_weight * read
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    opt.step()
    return float(out.ce_loss.detach()), float("nan") if read is None else float(read.detach())


def curve_family(rc: VisionExtractConfig) -> str:
    """The family of the training curve: the target family when it is trained on, else the heaviest."""
    return rc.target_family if rc.target_family in rc.mix else sorted(rc.mix, key=lambda f: -rc.mix[f])[0]


def pooled_f1(model: LongMoE, tok: Tokenizer, docs: list, inputs: str) -> float:
    """Pooled (micro) field F1 of greedy answers on ``docs``."""
    reps = decode_documents(model, tok, docs, [len(tok.encode(d.target)) + 16 for d in docs], inputs)
    tp = npred = ngold = 0
    for r, d in zip(reps, docs):
        s = score_answer(r.text, d.fields)
        tp, npred, ngold = tp + s["tp"], npred + s["n_pred"], ngold + s["n_gold"]
    p, rec = tp / max(1, npred), tp / max(1, ngold)
    return 2 * p * rec / (p + rec) if p + rec > 0 else 0.0


def curve_f1(model: LongMoE, tok: Tokenizer, rc: VisionExtractConfig, inputs: str) -> float:
    """Pooled field F1 on ``rc.curve_n`` held-out renders (greedy) of ``curve_family(rc)``, or split
    evenly among ``rc.curve_families``."""
    fams = rc.curve_families or [curve_family(rc)]
    seeds = held_out_seeds(max(1, rc.curve_n // len(fams)), CURVE_OFFSET)
    return pooled_f1(model, tok, [render(f, s) for f in fams for s in seeds], inputs)


def train_extractor(
    rc: VisionExtractConfig, tok: Tokenizer, out: Path, inputs: str, log: Callable[[str], None] = print
) -> tuple[LongMoE, TrainRun]:
    """Train (or resume, or load the finished) extractor reading ``inputs`` ("image" | "text" |
    "text_grid"); a control (not "image") trains ``rc.control_steps`` steps when that is set."""
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(rc.threads)
    run_file, model_dir = out / RUN_FILE, out / MODEL_DIR
    if run_file.is_file() and is_model_dir(model_dir):
        model = load_model(model_dir).model
        return model, TrainRun(**json.loads(run_file.read_text()))
    model = build_model(rc if inputs == "image" else control_config(rc), vision=True)
    opt = build_optimizer(model, rc.lr, rc.weight_decay, betas=RECIPE_BETAS)
    total = (rc.control_steps or rc.steps) if inputs != "image" else rc.steps
    sched = LRSchedule(opt, ScheduleConfig(lr=rc.lr, warmup_steps=rc.warmup_steps), total)
    progress, curve = Progress(), Curve()
    tok.save(out / TOKENIZER_FILE)
    cp = Checkpointer(
        out, model, opt, SingleProcess(ParallelDims(), torch.device("cpu")), model.cfg, out / TOKENIZER_FILE,
        progress, {"schedule": sched, "rng": RNG(), "curve": curve}, keep_last=1,
    )  # fmt: skip
    if _resume(out, cp, model, opt, curve):
        log(f"{out.name}: resuming at step {progress.step}")
    loss, read = float("nan"), float("nan")
    model.train()
    while progress.step < total:
        sched.apply()
        b = train_batch(rc.mix, progress.step, rc.batch_size, rc.seed, tok, model, inputs, rc.text_rows)
        loss, read = _step(model, opt, b, rc.read_weight)
        sched.advance()
        progress.step += 1
        step = progress.step
        if step % rc.curve_every == 0 or step == total:
            f1 = curve_f1(model, tok, rc, inputs)
            curve.points.append([step, round(loss, 4), round(f1, 4)])
            log(f"{out.name}: step {step}/{total} loss {loss:.3f} reading loss {read:.3f} held-out F1 "
                f"{f1:.3f} ({curve.seconds:.0f} s)")  # fmt: skip
        if step % rc.checkpoint_every == 0 and step < total:
            cp.save()
            log(f"{out.name}: step {step}/{total} loss {loss:.3f} reading loss {read:.3f} "
                f"({curve.seconds:.0f} s, {curve.cpu_seconds:.0f} CPU s)")  # fmt: skip
    run = TrainRun(
        inputs=inputs, steps=progress.step, seconds=round(curve.seconds, 1),
        cpu_seconds=round(curve.cpu_seconds, 1),
        params=sum(p.numel() for p in model.parameters()), curve=curve.points,
    )  # fmt: skip
    save_model_dir(model_dir, model, tok)
    run_file.write_text(json.dumps(run.__dict__, indent=2) + "\n")
    shutil.rmtree(out / CKPT_DIR, ignore_errors=True)  # the model directory is the result now
    (out / LEGACY_CKPT).unlink(missing_ok=True)
    return model, run


# ---------------------------------------------------------------------- the pretraining check
@functools.lru_cache(maxsize=2)
def _text(split: str, chars: int) -> str:
    """Standard-library source text of ``split`` (sorted files), at least ``chars`` characters."""
    root, parts, n = stdlib_root(), [], 0
    for rel in stdlib_files(split):
        t = (root / rel).read_text(encoding="utf-8", errors="replace")
        parts.append(t)
        n += len(t)
        if n >= chars:
            break
    return "\n".join(parts)


def text_rows(
    split: str, key: str, n: int, seq_len: int, tok: Tokenizer
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` random windows of ``seq_len`` tokens: ``(input_ids, labels)`` ``[n, seq_len]`` each."""
    text = _text(split, 2_000_000 if split == "train" else 300_000)
    rng = random.Random(f"vision-extract-text:{split}:{key}")
    rows = []
    for _ in range(n):
        i = rng.randrange(len(text) - 4 * seq_len)
        ids = tok.encode(text[i : i + 4 * seq_len])[: seq_len + 1]  # a few characters per token at most
        rows.append(ids)
    x = torch.tensor(rows)  # [n, seq_len + 1]
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def _mixed_batch(
    tx: torch.Tensor, ty: torch.Tensor, rc: VisionExtractConfig, step: int, tok: Tokenizer, model: LongMoE
) -> Batch:
    """The text rows plus ``rc.pretrain_image_rows`` image-document rows, padded to one width."""
    img = train_batch(rc.mix, 10_000_000 + step, rc.pretrain_image_rows, rc.seed, tok, model, "image")
    T = max(tx.shape[1], img.input_ids.shape[1])
    pad = lambda a, v: torch.nn.functional.pad(a, (0, T - a.shape[1]), value=v)
    x = torch.cat([pad(tx, tok.pad_id), pad(img.input_ids, tok.pad_id)])
    y = torch.cat([pad(ty, IGNORE_INDEX), pad(img.labels, IGNORE_INDEX)])
    return Batch(x, y, img.images, int((y != IGNORE_INDEX).sum()))


@torch.no_grad()
def text_val_loss(model: LongMoE, rc: VisionExtractConfig, tok: Tokenizer) -> float:
    model.eval()
    losses = []
    for k in range(rc.pretrain_val_batches):
        x, y = text_rows("val", f"val{k}", rc.pretrain_batch, rc.pretrain_seq_len, tok)
        losses.append(float(model(x, labels=y).ce_loss))
    model.train()
    return sum(losses) / len(losses)


def pretrain_check(
    rc: VisionExtractConfig, tok: Tokenizer, out: Path, log: Callable[[str], None] = print
) -> PretrainCheck:
    """Train the same LM twice on the same text batches, once with image documents mixed into every
    batch; compare their text validation loss. Stored as ``OUT/pretrain_check.json``."""
    f = out / "pretrain_check.json"
    if f.is_file():
        return PretrainCheck(**json.loads(f.read_text()))
    torch.set_num_threads(rc.threads)
    part = out / "pretrain_check.partial.json"  # one finished arm survives a killed run
    vals = json.loads(part.read_text()) if part.is_file() else {}
    for mode in ("text", "mixed"):
        if mode in vals:
            continue
        model = build_model(rc, vision=True)  # same seed: identical start; the text model never uses vision
        opt = build_optimizer(model, rc.lr, rc.weight_decay, betas=RECIPE_BETAS)
        sched = LRSchedule(opt, ScheduleConfig(lr=rc.lr, warmup_steps=rc.warmup_steps), rc.pretrain_steps)
        t0 = time.perf_counter()
        for step in range(rc.pretrain_steps):
            sched.apply()
            tx, ty = text_rows("train", f"{rc.seed}:{step}", rc.pretrain_batch, rc.pretrain_seq_len, tok)
            b = (
                _mixed_batch(tx, ty, rc, step, tok, model)
                if mode == "mixed"
                else Batch(tx, ty, [], ty.numel())
            )
            _step(model, opt, b)
            sched.advance()
        vals[mode] = text_val_loss(model, rc, tok)
        part.write_text(json.dumps(vals) + "\n")
        log(f"pretrain check: {mode}: text val loss {vals[mode]:.4f} ({time.perf_counter() - t0:.0f} s)")
    res = PretrainCheck(
        steps=rc.pretrain_steps, text_tokens=rc.pretrain_steps * rc.pretrain_batch * rc.pretrain_seq_len,
        image_rows=rc.pretrain_steps * rc.pretrain_image_rows, text_only_val=round(vals["text"], 4),
        mixed_val=round(vals["mixed"], 4), margin=rc.pretrain_margin,
    )  # fmt: skip
    f.write_text(json.dumps(res.__dict__, indent=2) + "\n")
    part.unlink(missing_ok=True)
    return res
