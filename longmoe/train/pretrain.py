"""Next-token pretraining through the context curriculum, resumable to the exact loss sequence.

One ``Trainer`` owns a run directory::

    RUN/config.json  train_config.json  tokenizer.json   what the run was started with (reused on resume)
    RUN/metrics.jsonl                                   one JSON object per logged step / evaluation
    RUN/checkpoints/step-XXXXXXXX/                      atomic checkpoints
    RUN/final/                                          the last weights as a plain model directory

(the layout and the checkpoint format are ``longmoe.checkpoint``'s).

Everything a step depends on (weights, AdamW moments, step count → learning rate, torch/Python RNG,
the curriculum's stage and every packer's position, the MoE balancers' bias and load window) is in
the checkpoint, so a CPU run resumed from step s logs the same losses as the run that never stopped.

Under ``torchrun`` the same trainer runs on every rank (``train/sharding.py``): the model is wrapped by
``distributed.parallelize`` (FSDP2), each rank trains on its windows of the global batch, gradient
norms, losses and balancer statistics are reduced over ranks, rank 0 logs, and checkpoints are sharded
(DCP) and resumable at another world size.
"""

from __future__ import annotations

import json
import logging
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from longmoe import checkpoint as ckpt
from longmoe.config import IGNORE_INDEX, IMAGE_PATCH_TOKEN_ID, ConfigError, ModelConfig
from longmoe.data.corpus import corpus_texts
from longmoe.data.tokenizer import Tokenizer
from longmoe.distributed import checkpoint as dcp_ckpt
from longmoe.distributed.parallel_dims import ParallelDims, barrier, init_distributed, is_rank0
from longmoe.distributed.parallelize import parallelize
from longmoe.distributed.reduce import all_reduce_sum, clip_grad_norm_, sync_balance_stats
from longmoe.memory import check_memory
from longmoe.model import WEIGHTS_FILE, LongMoE, ModelOutput
from longmoe.runlog import append_metrics, truncate_metrics
from longmoe.train.config import TrainConfig
from longmoe.train.curriculum import Curriculum, val_batches
from longmoe.train.drift import freeze_routing
from longmoe.train.optim import lr_at, param_groups
from longmoe.train.rng import rng_state, seed_everything, set_rng_state
from longmoe.train.sharding import (
    ParallelRun,
    batch_to,
    context_part,
    shard_batch,
    start_run,
    window_lengths,
)

MAX_BAD_STEPS = 8  # consecutive non-finite-gradient steps before training stops with an error

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------- pieces
def train_tokenizer(
    vocab_size: int, data: str | Path | None = None, max_chars: int = 20_000_000
) -> Tokenizer:
    """Byte-level BPE on the train split of the corpus (the first ``max_chars`` characters of it)."""
    return Tokenizer.train(corpus_texts(data, "train", max_chars), vocab_size=vocab_size)


def check_fits(cfg: ModelConfig, tok: Tokenizer) -> None:
    if tok.vocab_size > cfg.vocab_size:
        raise ConfigError(
            f"vocab_size={cfg.vocab_size} is too small for the tokenizer: it has {tok.vocab_size} tokens; "
            f"expected vocab_size >= {tok.vocab_size}"
        )
    if cfg.vision is not None and tok.image_patch_id != IMAGE_PATCH_TOKEN_ID:
        raise ConfigError(
            f"the tokenizer's <|image_patch|> has id {tok.image_patch_id}, but a vision model finds image "
            f"positions by id {IMAGE_PATCH_TOKEN_ID}: use a tokenizer trained by longmoe"
        )


def config_differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fields whose values differ between two config dicts (nested ones too)."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}")
    return out


# ---------------------------------------------------------------------------------------- trainer
class Trainer:
    """Builds (or resumes) a run and trains it; ``fit()`` runs to the end of the curriculum."""

    def __init__(
        self,
        run_dir: str | Path,
        model_cfg: ModelConfig | None = None,
        train_cfg: TrainConfig | None = None,
        tokenizer: Tokenizer | None = None,
        resume: bool = False,
        progress: bool = True,
        max_steps: int | None = None,
        device: str = "cpu",
        dims: ParallelDims | None = None,
    ) -> None:
        """``device``/``dims``: where and how this process trains (``dims``: the parallel layout under
        ``torchrun``; default from the train config, see ``train/sharding.start_run``)."""
        self.run_dir = Path(run_dir)
        self.progress, self.max_steps = progress, max_steps
        init_distributed(device)  # under torchrun: join the group (a no-op otherwise)
        existing = resume and (self.run_dir / ckpt.CONFIG_FILE).exists()
        restored = ckpt.load_latest(self.run_dir) if resume else None
        barrier()  # every rank has looked at the run directory before rank 0 writes into it
        if existing:
            # the run's own files win over what the caller passed: a resume must not change the run
            if restored is None:
                log.warning("--resume: no complete checkpoint in %s; starting from step 0", self.run_dir)
            model_cfg = ModelConfig.load(self.run_dir / ckpt.CONFIG_FILE)
            train_cfg = TrainConfig.load(self.run_dir / ckpt.TRAIN_CONFIG)
            tokenizer = Tokenizer.from_file(self.run_dir / ckpt.TOKENIZER_FILE)
        if model_cfg is None or train_cfg is None or tokenizer is None:
            raise ValueError(f"run {self.run_dir}: a new run needs a model config, train config, tokenizer")
        check_fits(model_cfg, tokenizer)
        check_memory(model_cfg)
        if restored is not None:
            self._check_checkpoint_config(restored[0], model_cfg)
        self.mcfg, self.tcfg, self.tok = model_cfg, train_cfg, tokenizer
        self.par: ParallelRun = start_run(train_cfg, device, dims)
        self.progress = progress and is_rank0()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not existing and is_rank0():
            model_cfg.save(self.run_dir / ckpt.CONFIG_FILE)
            train_cfg.save(self.run_dir / ckpt.TRAIN_CONFIG)
            tokenizer.save(self.run_dir / ckpt.TOKENIZER_FILE)
        barrier()

        seed_everything(train_cfg.seed)
        self.model = LongMoE(model_cfg).to(self.par.device)
        if train_cfg.freeze_router:  # before the optimizer: frozen routers are not in its groups
            freeze_routing(self.model)
        if self.par.enabled:
            parallelize(self.model, self.par.dims, self.par.mesh, train_cfg.activation_checkpointing)
        self.opt = torch.optim.AdamW(
            param_groups(self.model, train_cfg.weight_decay),
            lr=train_cfg.lr,
            betas=(train_cfg.beta1, train_cfg.beta2),
            eps=train_cfg.eps,
        )
        self.curriculum = self.make_data()
        self.total_steps = train_cfg.total_steps
        self.step, self.tokens = 0, 0
        self.skipped_steps, self.bad_streak = 0, 0  # steps whose gradients were not finite
        self.val_cache: dict[int, list[dict[str, torch.Tensor]]] = {}
        self.forward = torch.compile(self.model) if train_cfg.compile else self.model
        if restored is not None:
            self._restore(*restored)
        else:
            self._truncate_metrics(0)

    def make_data(self) -> Curriculum:
        """The batch stream (SFT overrides it: demonstrations plus replay, same stage bookkeeping)."""
        return Curriculum(self.tcfg.stages, self.tok, self.tcfg.seed, self.tcfg.data, vision=self.mcfg.vision)

    # ------------------------------------------------------------------ state
    def state(self) -> dict[str, Any]:
        """Trainer state for ``trainer_state.pt`` (a sharded run keeps the optimizer in ``dcp/``)."""
        out = {
            "step": self.step,
            "tokens": self.tokens,
            "skipped_steps": self.skipped_steps,
            "rng": rng_state(),
            "curriculum": self.curriculum.state(),
        }
        if not self.par.enabled:
            out["optimizer"] = self.opt.state_dict()
        return out

    def _check_checkpoint_config(self, path: Path, cfg: ModelConfig) -> None:
        """A checkpoint copied in from another run would fail to load (or load into the wrong model)."""
        theirs = json.loads((path / ckpt.CONFIG_FILE).read_text())
        diff = config_differences(cfg.to_dict(), theirs)
        if diff:
            raise ckpt.CheckpointError(
                f"checkpoint {path} comes from another config: its {ckpt.CONFIG_FILE} differs from "
                f"{self.run_dir / ckpt.CONFIG_FILE} in {', '.join(diff)}"
            )

    def _restore(self, path: Path, state: dict[str, Any]) -> None:
        if ckpt.is_sharded(path):  # written by several processes: DCP reshards to this layout
            dcp_ckpt.load_sharded(self.model, self.opt, path)
        elif self.par.enabled:  # a one-process checkpoint, resumed by several
            sd = load_file(str(path / WEIGHTS_FILE))
            dcp_ckpt.load_full(self.model, self.opt, sd, state["optimizer"])
        else:
            ckpt.load_weights(self.model, path)
            self.opt.load_state_dict(state["optimizer"])
        self.curriculum.restore(state["curriculum"])
        set_rng_state(state["rng"])
        self.step, self.tokens = int(state["step"]), int(state["tokens"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self._truncate_metrics(self.step)
        log.info("resumed %s at step %d (%s)", self.run_dir, self.step, path.name)

    def _truncate_metrics(self, step: int) -> None:
        if is_rank0():
            truncate_metrics(self.run_dir, step)

    def save(self) -> Path:
        if self.par.enabled:
            return dcp_ckpt.save_sharded_checkpoint(
                self.run_dir, self.step, self.model, self.opt, self.mcfg,
                self.run_dir / ckpt.TOKENIZER_FILE, self.state(), self.tcfg.keep_last,
            )  # fmt: skip
        return ckpt.save_checkpoint(
            self.run_dir, self.step, self.model, self.run_dir / ckpt.TOKENIZER_FILE, self.state(),
            self.tcfg.keep_last,
        )  # fmt: skip

    def export(self, path: Path) -> Path:
        """Write the current weights as a plain model directory (atomically replacing ``path``)."""
        if self.par.enabled:
            return dcp_ckpt.export_model(self.model, self.mcfg, path, self.run_dir / ckpt.TOKENIZER_FILE)
        return ckpt.save_model_dir(path, self.model, self.tok)

    def log(self, rec: dict[str, Any]) -> None:
        if not is_rank0():
            return
        append_metrics(self.run_dir, rec)

    # ------------------------------------------------------------------ steps
    def _autocast(self) -> Any:
        dev = self.par.device.type
        return torch.autocast(dev, dtype=torch.bfloat16) if self.tcfg.bf16 else nullcontext()

    def train_step(self) -> dict[str, Any]:
        """One optimizer step over ``grad_accum`` packed batches; returns the step's log record."""
        self.model.train()
        t0 = time.perf_counter()
        lr = lr_at(self.step, self.tcfg, self.total_steps)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.zero_grad(set_to_none=True)
        n_micro, loss_sum, ce_sum, aux_sum, ntok = 0, 0.0, 0.0, 0.0, 0
        stage = self.curriculum.stage_idx
        window = self.curriculum.stage.window
        while n_micro < self.tcfg.grad_accum and not self.curriculum.done:
            b = self.curriculum.next_batch()
            self._check_images(b)
            stage, window = b["stage"], b["window"]
            b = batch_to(self._local(b), self.par.device)
            with self._autocast():
                out = self.forward(
                    b["input_ids"], labels=b["labels"], cu_seqlens=b["cu_seqlens"],
                    image_embeds=self._image_embeds(b),
                )  # fmt: skip
            if self.par.enabled:
                ce, aux, loss = self._sharded_loss(out, b["labels"])
                loss_value = ce + aux
            else:
                ce, aux, loss = float(out.ce_loss.detach()), float(out.aux_loss.detach()), out.loss
                loss_value = float(out.loss.detach())
            (loss / self.tcfg.grad_accum).backward()
            loss_sum += loss_value
            ce_sum += ce
            aux_sum += aux
            ntok += int(b["input_ids"].numel())
            n_micro += 1
        if self.par.enabled:  # every rank reports the global batch: sums of per-rank shares
            ce_sum, aux_sum, ntok_f = all_reduce_sum([ce_sum, aux_sum, float(ntok)])
            loss_sum, ntok = ce_sum + aux_sum, int(ntok_f)
        if n_micro < self.tcfg.grad_accum:  # a last partial group: rescale to a mean over what ran
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(self.tcfg.grad_accum / n_micro)
        clip = self.tcfg.grad_clip if self.tcfg.grad_clip > 0 else float("inf")
        if self.par.enabled:  # the norm over every rank's gradient shards
            gnorm = clip_grad_norm_(self.model.parameters(), clip)
        else:
            gnorm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
        skipped = not math.isfinite(gnorm)
        if skipped:  # an inf/nan gradient would poison every weight it touches (and Adam's moments)
            self.opt.zero_grad(set_to_none=True)
            self.skipped_steps += 1
            self.bad_streak += 1
            log.warning("step %d: non-finite gradient norm, optimizer step skipped", self.step)
            if self.bad_streak >= MAX_BAD_STEPS:
                raise FloatingPointError(
                    f"{self.bad_streak} consecutive steps with non-finite gradients (last at step "
                    f"{self.step}, lr {lr:.3g}); the weights are unchanged since the last good step: "
                    "lower --lr, or resume from the last checkpoint"
                )
        else:
            self.bad_streak = 0
            self.opt.step()
        sync_balance_stats(self.model.moe_layers())  # every rank folds the global load (no-op alone)
        for m in self.model.moe_layers():
            m.update_balance()
        self.step += 1
        self.tokens += ntok
        dt = time.perf_counter() - t0
        rec: dict[str, Any] = {
            "step": self.step,
            "stage": stage,
            "stage_name": self.tcfg.stages[stage].name,
            "window": window,
            "loss": loss_sum / n_micro,
            "ce_loss": ce_sum / n_micro,
            "aux_loss": aux_sum / n_micro,
            "lr": lr,
            "grad_norm": gnorm,
            "skipped": skipped,
            "tokens": self.tokens,
            "tokens_per_s": ntok / dt,
        }
        rec.update(self.balance_record())
        return rec

    def _check_images(self, batch: dict[str, Any]) -> None:
        """Refuse images under torchrun, on the global batch (the same on every rank, so every rank
        stops: a rank that went on would wait for the others in a collective)."""
        if self.par.enabled and batch.get("images"):
            raise ConfigError(
                "image documents train in one process only: under torchrun the vision encoder's "
                "gradients would be reduced only on ranks whose windows hold images, and context "
                "parallelism would cut image spans (run without torchrun)"
            )

    def _image_embeds(self, batch: dict[str, Any]) -> torch.Tensor | None:
        """Patch embeddings of the batch's images (``[n, d]``, row order), encoded in this step so the
        vision encoder trains with the language model; None for a batch without images."""
        images = batch.get("images")
        return self.model.encode_images(images) if images else None

    def _local(self, batch: dict[str, Any]) -> dict[str, Any]:
        """This rank's windows of the global ``batch`` (the whole batch in a single process)."""
        lengths = window_lengths(self.tcfg.stages[batch["stage"]])
        mine = shard_batch(batch, lengths, self.par.data_rank, self.par.data_degree)
        return context_part(mine, self.par.cp_rank, self.par.dims.cp)

    def _sharded_loss(self, out: ModelOutput, labels: torch.Tensor) -> tuple[float, float, torch.Tensor]:
        """The loss this rank back-propagates so that FSDP's mean over ranks is the one-process
        gradient: its CE weighted by its share of the global batch's targets (× ranks, which FSDP
        divides back out); the aux loss is averaged. Returns this rank's share of the global CE and
        aux loss (they sum to the global values over ranks) and the loss to back-propagate."""
        n_local = int((labels != IGNORE_INDEX).sum())
        (n_all,) = all_reduce_sum([float(n_local)])
        w = self.par.world
        if n_local == 0:  # no targets here (CE is NaN): a zero loss that still runs every backward hook
            ce_term = out.logits.float().sum() * 0.0
            ce_share = 0.0
        else:
            ce_term = out.ce_loss * (n_local * w / n_all)
            ce_share = float(out.ce_loss.detach()) * n_local / n_all
        return ce_share, float(out.aux_loss.detach()) / w, ce_term + out.aux_loss

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
                self._check_images(b)
        self.model.eval()
        total, count = 0.0, 0
        batches, part, parts = self.val_cache[length], self.par.data_rank, self.par.data_degree
        # data rank r scores windows r, r + parts, ...; a rank short of one reruns window 0 unscored,
        # since every rank must take part in each (sharded) forward
        for i in range(-(-len(batches) // parts)):
            j = i * parts + part
            b = context_part(batches[j if j < len(batches) else 0], self.par.cp_rank, self.par.dims.cp)
            b = batch_to(b, self.par.device)
            with self._autocast():
                out = self.model(
                    b["input_ids"], labels=b["labels"], cu_seqlens=b["cu_seqlens"],
                    image_embeds=self._image_embeds(b),
                )  # fmt: skip
            k = int((b["labels"] != IGNORE_INDEX).sum()) if j < len(batches) else 0
            if k:
                total, count = total + float(out.ce_loss) * k, count + k
        total, count = all_reduce_sum([total, float(count)])
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
