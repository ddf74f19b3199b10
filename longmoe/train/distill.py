"""Distil a speculative-decoding draft from its target.

A draft's worth is how often the target keeps what it proposes, i.e. its agreement with the *target's*
next-token distribution, not with the data. So the draft is trained on the target's own output:
per position the loss is ``KL(p_target || q_draft)`` (the forward KL, which puts the draft's mass where
the target's is), over windows of the training corpus. A draft made of the target's first layers
(``serve.speculative.truncated_draft``) starts close, and a short distillation closes much of the rest.

The draft's MoE layers keep balancing as in pretraining (``update_balance`` after every step), so the
distilled draft routes as evenly as a pretrained one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from longmoe.data.corpus import corpus_documents
from longmoe.data.tokenizer import Tokenizer
from longmoe.model import LongMoE
from longmoe.train.optim import build_optimizer

DISTILL_BETAS = (0.9, 0.999)  # torch's AdamW defaults, which distillation has always used


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 200
    batch: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "seq_len"):
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
    target: LongMoE, draft: LongMoE, tokens: torch.Tensor, cfg: DistillConfig, progress: bool = False
) -> list[float]:
    """Train ``draft`` (in place) towards ``target`` on random ``seq_len`` windows of ``tokens`` [N];
    returns the KL of every step. ``target`` is only read."""
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise ValueError("distill: the draft must share the target's vocabulary")
    if tokens.numel() <= cfg.seq_len:
        raise ValueError(f"distill: {tokens.numel()} tokens is fewer than one window of {cfg.seq_len}")
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = build_optimizer(draft, cfg.lr, weight_decay=0.0, betas=DISTILL_BETAS)
    target.eval()
    draft.train()
    losses = []
    for _ in tqdm(range(cfg.steps), desc="distill", disable=not progress):
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
        losses.append(float(loss.detach()))
    draft.eval()
    return losses
