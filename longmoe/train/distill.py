"""Distil a speculative-decoding draft from its target.

A draft's worth is how often the target keeps what it proposes, i.e. its agreement with the *target's*
next-token distribution, not with the data. So the draft is trained on the target's own output:
per position the loss is ``KL(p_target || q_draft)`` (the forward KL, which puts the draft's mass where
the target's is), over windows of the training corpus. A draft made of the target's first layers
(``serve.speculative.truncated_draft``) starts close, and a short distillation closes much of the rest.

The draft's MoE layers keep balancing as in pretraining (``update_balance`` after every step), so the
distilled draft routes as evenly as a pretrained one.

Given a run directory, distillation is a training run like the others (``train/checkpointer.py``):
``RUN/config.json`` (the draft's model config), ``RUN/distill_config.json`` (these settings and the
target's model config, written once; a later start with others is refused in one line) and
``RUN/checkpoints/step-N/`` every ``checkpoint_every`` steps and at the end (the draft, its optimizer,
the window generator, the KL curve, RNG, step). A start on an existing run resumes from its newest
checkpoint and ends as a run that never stopped would: same KL per step, same weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from longmoe import checkpoint as ckpt
from longmoe.data.corpus import corpus_documents
from longmoe.data.tokenizer import Tokenizer
from longmoe.distributed.parallel_dims import ParallelDims
from longmoe.model import LongMoE
from longmoe.train.checkpointer import RNG, Checkpointer, Curve, GeneratorState, Progress
from longmoe.train.optim import build_optimizer
from longmoe.train.parallel import SingleProcess
from longmoe.train.run import pin_config

DISTILL_BETAS = (0.9, 0.999)  # torch's AdamW defaults, which distillation has always used
DISTILL_CONFIG = "distill_config.json"  # RUN/distill_config.json: the settings and the target's config


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 200
    batch: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    seed: int = 0
    checkpoint_every: int = 50  # steps between checkpoints (with a run directory)

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "seq_len", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"distill.{name}={v!r} is invalid: expected an integer >= 1")
        if not self.lr > 0:
            raise ValueError(f"distill.lr={self.lr!r} is invalid: expected a float > 0")


def corpus_tokens(tokenizer: Tokenizer, max_tokens: int, split: str = "train") -> torch.Tensor:
    """``[N]``: the ``split`` documents of the default corpus, encoded and concatenated (eos between)."""
    out: list[int] = []
    for d in corpus_documents(None, split=split, kind="file"):
        out += tokenizer.encode(d.text, bos=True, eos=True)
        if len(out) >= max_tokens:
            break
    return torch.tensor(out[:max_tokens])


def forward_kl(target_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of ``KL(p || q)``, ``p = softmax(target)``, ``q = softmax(draft)``; [..., V] in."""
    logp = F.log_softmax(target_logits.float(), -1)
    logq = F.log_softmax(draft_logits.float(), -1)
    return (logp.exp() * (logp - logq)).sum(-1).mean()


def distill(
    target: LongMoE,
    draft: LongMoE,
    tokens: torch.Tensor,
    cfg: DistillConfig,
    progress: bool = False,
    run_dir: str | Path | None = None,
    tokenizer: Tokenizer | None = None,
) -> list[float]:
    """Train ``draft`` (in place) towards ``target`` on random ``seq_len`` windows of ``tokens`` [N];
    returns the KL of every step. ``target`` is only read. ``run_dir``: checkpoint there and resume
    from it (module docstring); ``tokenizer``: stored with the checkpoints, which are then model
    directories ``longmoe serve`` reads."""
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError("distill: the draft must share the target's vocabulary")
    if tokens.numel() <= cfg.seq_len:
        raise ValueError(f"distill: {tokens.numel()} tokens is fewer than one window of {cfg.seq_len}")
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = build_optimizer(draft, cfg.lr, weight_decay=0.0, betas=DISTILL_BETAS)
    done, kl = Progress(), Curve()  # kl.points: [step, KL] per step
    cp = None if run_dir is None else _run(Path(run_dir), target, draft, opt, cfg, gen, done, kl, tokenizer)
    target.eval()
    draft.train()
    for _ in tqdm(range(done.step, cfg.steps), desc="distill", disable=not progress):
        starts = torch.randint(0, tokens.numel() - cfg.seq_len, (cfg.batch,), generator=gen)
        x = torch.stack([tokens[s : s + cfg.seq_len] for s in starts.tolist()])  # [B, T]
        with torch.no_grad():
            p = target(x).logits  # [B, T, V]
        loss = forward_kl(p, draft(x).logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        for m in draft.moe_layers():
            m.update_balance()
        kl.points.append([done.step, float(loss.detach())])
        done.step += 1
        if cp is not None and (done.step % cfg.checkpoint_every == 0 or done.step == cfg.steps):
            cp.save()
    draft.eval()
    return [p[1] for p in kl.points]


def _run(
    run_dir: Path, target: LongMoE, draft: LongMoE, opt: torch.optim.Optimizer, cfg: DistillConfig,
    gen: torch.Generator, done: Progress, kl: Curve, tokenizer: Tokenizer | None,
) -> Checkpointer:  # fmt: skip
    """The run directory's checkpointer, restored to its newest checkpoint when there is one (a run
    started with other settings, another target or another draft is refused first)."""
    pin_config(run_dir / DISTILL_CONFIG, {"distill": asdict(cfg), "target": target.cfg.to_dict()}, "distill")
    pin_config(run_dir / ckpt.CONFIG_FILE, draft.cfg.to_dict(), "the draft's model config")
    tok_file = None
    if tokenizer is not None:
        tok_file = run_dir / ckpt.TOKENIZER_FILE
        tokenizer.save(tok_file)
    parts = {"data": GeneratorState(gen), "kl": kl, "rng": RNG()}
    strategy = SingleProcess(ParallelDims(), torch.device("cpu"))
    cp = Checkpointer(run_dir, draft, opt, strategy, draft.cfg, tok_file, done, parts, keep_last=1)
    cp.restore()
    return cp
