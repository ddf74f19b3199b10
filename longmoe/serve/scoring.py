"""Prompt scoring: the log-probability the model gives each prompt token after the tokens before it.

What ``/v1/completions`` returns for ``echo`` with ``logprobs`` (the OpenAI legacy format lm-evaluation-
harness scores log-likelihood tasks with): ``token_logprobs[0]`` is ``None`` (nothing predicts the first
token), ``token_logprobs[t] = log p(x_t | x_<t)``, and ``top_logprobs[t]`` the ``k`` most likely tokens at
position ``t``. The prompt is fed in chunks through a model cache, so memory holds one chunk's logits,
not ``T × vocab``; any chunking gives the same numbers as one full forward (the cache is exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from longmoe.model import LongMoE

DEFAULT_CHUNK = 512


@dataclass
class PromptScores:
    token_logprobs: list[float | None]  # [T]: None, then log p(x_t | x_<t)
    top_logprobs: list[list[tuple[int, float]] | None] | None  # [T] of k (id, logprob), or None (k = 0)
    next_logprobs: torch.Tensor  # [vocab] fp32: the distribution after the whole prompt


@torch.inference_mode()
def score_prompt(model: LongMoE, ids: list[int], top_k: int = 0, chunk: int = DEFAULT_CHUNK) -> PromptScores:
    """Score ``ids`` (at least one token) with ``model``; ``top_k`` alternatives per position (0 = none)."""
    if not ids:
        raise ValueError("ids: expected at least one token")
    if top_k < 0 or chunk < 1:
        raise ValueError(f"top_k >= 0 and chunk >= 1 expected, got top_k={top_k}, chunk={chunk}")
    device = model.embed.weight.device
    cache = model.new_cache(1, device)
    x = torch.tensor([ids], dtype=torch.long, device=device)  # [1, T]
    lps: list[float | None] = [None]
    tops: list[list[tuple[int, float]] | None] | None = [None] if top_k else None
    last = None
    for lo in range(0, len(ids), chunk):
        logits = model(x[:, lo : lo + chunk], cache=cache).logits[0].float()  # [c, V]
        logp = torch.log_softmax(logits, dim=-1)
        nxt = x[0, lo + 1 : lo + 1 + logp.shape[0]]  # the tokens these positions predict
        rows = logp[: nxt.shape[0]]
        lps.extend(rows.gather(1, nxt[:, None])[:, 0].tolist())
        if tops is not None and rows.shape[0]:
            v, i = rows.topk(min(top_k, rows.shape[-1]), dim=-1)
            tops.extend([list(zip(a, b, strict=True)) for a, b in zip(i.tolist(), v.tolist(), strict=True)])
        last = logp[-1]
    assert last is not None
    return PromptScores(lps, tops, last)
