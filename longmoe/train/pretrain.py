"""Next-token pretraining through the context curriculum, resumable to the exact loss sequence.

One ``Trainer`` owns a run directory::

    RUN/config.json  train_config.json  tokenizer.json   what the run was started with (reused on resume)
    RUN/metrics.jsonl                                   one JSON object per logged step / evaluation
    RUN/checkpoints/step-XXXXXXXX/                      atomic checkpoints
    RUN/final/                                          the last weights as a plain model directory

(the layout is ``longmoe.checkpoint``'s; resume or start is decided by ``train/run.py``).

The file reads top to bottom: setup (``__init__``: run files, strategy, model, optimizer + schedule,
data, checkpointer), one step (``train_step``), evaluation (``evaluate``), the loop with its saves
(``fit``). Everything a step depends on (weights, AdamW moments, the schedule's position, torch/Python
RNG, the curriculum's stage and every packer's position, the MoE balancers' bias and load window) is a
part of the ``Checkpointer`` (``train/checkpointer.py``), so a CPU run resumed from step s logs the
same losses as the run that never stopped.

Under ``torchrun`` the same trainer runs on every rank; the ``Strategy`` (``train/parallel.py``) wraps
the model (FSDP2 / EP / CP), gives each rank its windows of the global batch, weights and reduces the
losses, norms and balancer statistics over ranks, and writes sharded (DCP) checkpoints resumable at
another world size; rank 0 logs. The loop itself has no branch on it.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from longmoe import checkpoint as ckpt
from longmoe.config import IGNORE_INDEX, ModelConfig
from longmoe.data.batch import Batch
from longmoe.distributed.parallel_dims import ParallelDims, barrier, is_rank0
from longmoe.model import LongMoE
from longmoe.runlog import append_metrics, truncate_metrics
from longmoe.train.checkpointer import RNG, Checkpointer, Progress
from longmoe.train.config import TrainConfig
from longmoe.train.curriculum import Curriculum, val_batches
from longmoe.train.drift import freeze_routing
from longmoe.train.optim import LRSchedule, build_optimizer
from longmoe.train.parallel import build_strategy, join
from longmoe.train.rng import seed_everything
from longmoe.train.run import TokenizerSource, open_run

MAX_BAD_STEPS = 8  # consecutive non-finite-gradient steps before training stops with an error

log = logging.getLogger(__name__)


class Trainer:
    """Builds (or resumes) a run and trains it; ``fit()`` runs to the end of the curriculum."""

    def __init__(
        self,
        run_dir: str | Path,
        model_cfg: ModelConfig | None = None,
        train_cfg: TrainConfig | None = None,
        tokenizer: TokenizerSource = None,
        resume: bool = False,
        progress: bool = True,
        max_steps: int | None = None,
        device: str = "cpu",
        dims: ParallelDims | None = None,
    ) -> None:
        """``tokenizer``: a ``Tokenizer`` or a function making one (called after the memory check);
        ``device``/``dims``: where and how this process trains (``dims``: the parallel layout under
        ``torchrun``; default from the train config, see ``train/parallel.build_strategy``)."""
        self.run_dir = Path(run_dir)
        self.max_steps = max_steps
        join(device)  # under torchrun: join the group before any rank reads or writes the run
        files = open_run(self.run_dir, resume, model_cfg, train_cfg, tokenizer)
        barrier()  # every rank has looked at the run directory before rank 0 writes into it
        self.mcfg, self.tcfg, self.tok = files.model_cfg, files.train_cfg, files.tokenizer
        self.par = build_strategy(self.tcfg, device, dims)
        self.progress = progress and is_rank0()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not files.existing and is_rank0():
            files.write(self.run_dir)
        barrier()

        seed_everything(self.tcfg.seed)
        self.model = LongMoE(self.mcfg).to(self.par.device)
        if self.tcfg.freeze_router:  # before the optimizer: frozen routers are not in its groups
            freeze_routing(self.model)
        self.par.wrap(self.model, self.tcfg.activation_checkpointing)
        t = self.tcfg
        self.opt = build_optimizer(self.model, t.lr, t.weight_decay, (t.beta1, t.beta2), t.eps)
        self.total_steps = t.total_steps
        self.schedule = LRSchedule(self.opt, t, self.total_steps)
        self.curriculum = self.make_data()
        self.counters = Progress()
        self.bad_streak = 0  # consecutive steps whose gradients were not finite
        self.val_cache: dict[int, list[Batch]] = {}
        self.forward = torch.compile(self.model) if t.compile else self.model
        self.checkpointer = Checkpointer(
            self.run_dir, self.model, self.opt, self.par, self.mcfg, self.run_dir / ckpt.TOKENIZER_FILE,
            self.counters, {"schedule": self.schedule, "curriculum": self.curriculum, "rng": RNG()},
            t.keep_last,
        )  # fmt: skip
        if resume and self.checkpointer.restore() is None and files.existing:
            log.warning("--resume: no complete checkpoint in %s; starting from step 0", self.run_dir)
        if is_rank0():  # a resumed log reads as one uninterrupted run
            truncate_metrics(self.run_dir, self.step)

    def make_data(self) -> Curriculum:
        """The batch stream (SFT overrides it: demonstrations plus replay, same stage bookkeeping)."""
        return Curriculum(self.tcfg.stages, self.tok, self.tcfg.seed, self.tcfg.data, vision=self.mcfg.vision)

    # ------------------------------------------------------------------ progress
    @property
    def step(self) -> int:
        return self.counters.step

    @property
    def tokens(self) -> int:
        return self.counters.tokens

    @property
    def skipped_steps(self) -> int:
        return self.counters.skipped_steps

    def state(self) -> dict[str, Any]:
        """What a checkpoint's ``trainer_state.pt`` holds besides the model and optimizer."""
        return self.checkpointer.state()

    def save(self) -> Path:
        return self.checkpointer.save()

    def export(self, path: Path) -> Path:
        """Write the current weights as a plain model directory (atomically replacing ``path``)."""
        return self.par.export(self.model, self.mcfg, path, self.tok, self.run_dir / ckpt.TOKENIZER_FILE)

    def log(self, rec: dict[str, Any]) -> None:
        if is_rank0():
            append_metrics(self.run_dir, rec)

    # ------------------------------------------------------------------ steps
    def _autocast(self) -> Any:
        dev = self.par.device.type
        return torch.autocast(dev, dtype=torch.bfloat16) if self.tcfg.bf16 else nullcontext()

    def train_step(self) -> dict[str, Any]:
        """One optimizer step over ``grad_accum`` packed batches; returns the step's log record."""
        self.model.train()
        t0 = time.perf_counter()
        lr = self.schedule.apply()
        self.opt.zero_grad(set_to_none=True)
        n_micro, ce_sum, aux_sum, ntok = 0, 0.0, 0.0, 0
        stage, window = self.curriculum.stage_idx, self.curriculum.stage.window
        while n_micro < self.tcfg.grad_accum and not self.curriculum.done:
            batch = self.curriculum.next_batch()
            self.par.check_images(batch)
            stage, window = batch.stage, batch.window
            b = self.par.local(batch)
            with self._autocast():
                out = self.forward(
                    b.input_ids, labels=b.labels, cu_seqlens=b.cu_seqlens, image_embeds=self._image_embeds(b)
                )
            ce, aux, loss = self.par.loss(out, b.labels)
            (loss / self.tcfg.grad_accum).backward()
            ce_sum, aux_sum, ntok, n_micro = ce_sum + ce, aux_sum + aux, ntok + b.n_tokens, n_micro + 1
        # every rank reports the global batch: sums of per-rank shares (one process: the values)
        ce_sum, aux_sum, ntok_f = self.par.reduce([ce_sum, aux_sum, float(ntok)])
        ntok = int(ntok_f)
        if n_micro < self.tcfg.grad_accum:  # a last partial group: rescale to a mean over what ran
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.tcfg.grad_accum / n_micro)
        clip = self.tcfg.grad_clip if self.tcfg.grad_clip > 0 else float("inf")
        gnorm = self.par.clip_grad_norm(self.model.parameters(), clip)
        skipped = not math.isfinite(gnorm)
        if skipped:  # an inf/nan gradient would poison every weight it touches (and Adam's moments)
            self._skip(lr)
        else:
            self.bad_streak = 0
            self.opt.step()
        self.par.sync_balance(self.model)
        for m in self.model.moe_layers():
            m.update_balance()
        self.schedule.advance()
        self.counters.step += 1
        self.counters.tokens += ntok
        dt = time.perf_counter() - t0
        rec: dict[str, Any] = {
            "step": self.step, "stage": stage, "stage_name": self.tcfg.stages[stage].name, "window": window,
            "loss": (ce_sum + aux_sum) / n_micro, "ce_loss": ce_sum / n_micro, "aux_loss": aux_sum / n_micro,
            "lr": lr, "grad_norm": gnorm, "skipped": skipped, "tokens": self.tokens,
            "tokens_per_s": ntok / dt,
        }  # fmt: skip
        rec.update(self.balance_record())
        return rec

    def _skip(self, lr: float) -> None:
        """Drop a step whose gradient norm is not finite; stop after ``MAX_BAD_STEPS`` in a row."""
        self.opt.zero_grad(set_to_none=True)
        self.counters.skipped_steps += 1
        self.bad_streak += 1
        log.warning("step %d: non-finite gradient norm, optimizer step skipped", self.step)
        if self.bad_streak >= MAX_BAD_STEPS:
            raise FloatingPointError(
                f"{self.bad_streak} consecutive steps with non-finite gradients (last at step "
                f"{self.step}, lr {lr:.3g}); the weights are unchanged since the last good step: "
                "lower --lr, or resume from the last checkpoint"
            )

    def _image_embeds(self, batch: Batch) -> torch.Tensor | None:
        """Patch embeddings of the batch's images (``[n, d]``, row order), encoded in this step so the
        vision encoder trains with the language model; None for a batch without images."""
        return self.model.encode_images(batch.images) if batch.images else None

    def balance_record(self, with_load: bool = False) -> dict[str, Any]:
        moe = self.model.moe_layers()
        if not moe:
            return {}
        ms = [m.balance_metrics() for m in moe]
        rec = {
            "max_vio": [round(m["max_vio"], 5) for m in ms],
            "dead_experts": [m["dead_experts"] for m in ms],
            "router_entropy": [round(m["router_entropy"], 5) for m in ms],
        }
        if with_load:
            rec["load"] = [[round(x, 5) for x in m["load"]] for m in ms]
        return rec

    @torch.no_grad()
    def evaluate(self, length: int, n_windows: int | None = None) -> float:
        """Mean next-token loss on fixed validation windows of ``length`` tokens (no aux loss)."""
        n = n_windows or self.tcfg.val_windows
        if length not in self.val_cache:
            self.val_cache[length] = val_batches(
                self.tok, length, n, data=self.tcfg.data, vision=self.mcfg.vision
            )
            for b in self.val_cache[length]:
                self.par.check_images(b)
        self.model.eval()
        total, count = 0.0, 0
        batches, part, parts = self.val_cache[length], self.par.data_rank, self.par.data_degree
        # data rank r scores windows r, r + parts, ...; a rank short of one reruns window 0 unscored,
        # since every rank must take part in each (sharded) forward
        for i in range(-(-len(batches) // parts)):
            j = i * parts + part
            b = self.par.eval_part(batches[j if j < len(batches) else 0])
            with self._autocast():
                out = self.model(
                    b.input_ids, labels=b.labels, cu_seqlens=b.cu_seqlens, image_embeds=self._image_embeds(b)
                )
            k = int((b.labels != IGNORE_INDEX).sum()) if j < len(batches) else 0
            if k:
                total, count = total + float(out.ce_loss) * k, count + k
        total, count = self.par.reduce([total, float(count)])
        return total / count

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, Any]:
        """Train to the end of the curriculum (or ``max_steps``); returns a summary."""
        total = self.total_steps if self.max_steps is None else min(self.total_steps, self.max_steps)
        bar = tqdm(total=total, initial=self.step, disable=not self.progress, unit="step", dynamic_ncols=True)
        val_losses: dict[str, float] = {}
        try:
            while self.step < total and not self.curriculum.done:
                stage_before = self.curriculum.stage_idx
                rec = self.train_step()
                stage_done = self.curriculum.stage_idx != stage_before or self.curriculum.done
                ev = self.tcfg.eval_every and self.step % self.tcfg.eval_every == 0
                if stage_done or ev:
                    w = self.tcfg.stages[rec["stage"]].window
                    rec["val_loss"] = self.evaluate(w)
                    rec["val_window"] = w
                    rec.update(self.balance_record(with_load=True))
                    if stage_done:
                        val_losses[self.tcfg.stages[rec["stage"]].name] = rec["val_loss"]
                if self.step % self.tcfg.log_every == 0 or "val_loss" in rec:
                    self.log(rec)
                bar.update(1)
                bar.set_postfix(
                    loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", stage=rec["stage_name"]
                )
                if self.tcfg.ckpt_every and self.step % self.tcfg.ckpt_every == 0:
                    self.save()
        finally:
            bar.close()
        if not self.tcfg.ckpt_every or self.step % self.tcfg.ckpt_every:
            self.save()
        self.export(self.run_dir / ckpt.FINAL_DIR)
        return {
            "steps": self.step,
            "tokens": self.tokens,
            "skipped_steps": self.skipped_steps,
            "val_loss_at_stage_end": val_losses,
        }
