"""Loss by position, up to and beyond the training window: does the model extrapolate in length?

Held-out documents of at least ``max_len`` tokens (standard-library validation files by default, or
the user's ``--data``) are run through ``LongMoE`` in chunks of ``chunk`` tokens continuing one
cache, so a context many times the training window fits in memory (MLA keeps a latent per token,
KDA a fixed state). The next-token loss of every position is averaged in buckets of ``bucket``
positions; ``inside`` / ``beyond`` are the means before and after the training window. NoPE
attention plus linear layers should keep ``beyond`` close to the loss at the end of the window.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from longmoe.data.corpus import corpus_documents
from longmoe.data.tokenizer import Tokenizer
from longmoe.model import LongMoE

DEFAULT_CHUNK = 1024


@torch.no_grad()
def position_losses(model: LongMoE, ids: list[int], chunk: int = DEFAULT_CHUNK) -> torch.Tensor:
    """``[len(ids) - 1]``: loss of token ``t + 1`` given tokens ``0..t`` (chunked prefill into one cache)."""
    device = next(model.parameters()).device
    x_all = torch.tensor(ids, device=device)  # [L]
    cache = model.new_cache(1, device)
    out = []
    n = len(ids) - 1
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        logits = model(x_all[s:e][None], cache=cache).logits[0].float()  # [t, V]
        out.append(F.cross_entropy(logits, x_all[s + 1 : e + 1], reduction="none").cpu())
    return torch.cat(out)


def long_documents(
    tokenizer: Tokenizer, max_len: int, n_docs: int, data: str | Path | None = None
) -> tuple[list[list[int]], bool]:
    """``n_docs`` token lists of ``max_len`` tokens (bos first) from validation documents.

    Documents at least ``max_len`` long are used whole (cut to ``max_len``); when there are not
    enough, the remaining ones are concatenated with ``eos`` between them (returned flag True), which
    makes the far positions less informative: the report says so.
    """
    docs, short = [], []
    for d in corpus_documents(data, split="val", kind="file"):
        ids = tokenizer.encode(d.text, bos=True)
        if len(ids) >= max_len:
            docs.append(ids[:max_len])
            if len(docs) == n_docs:
                return docs, False
        else:
            short.append(ids + [tokenizer.eos_id])
    buf: list[int] = []
    for ids in short:
        buf += ids
        if len(buf) >= max_len:
            docs.append(buf[:max_len])
            buf = []
            if len(docs) == n_docs:
                break
    if not docs:
        raise ValueError(f"the validation documents hold fewer than max_len={max_len} tokens in total")
    return docs, True


def ppl_by_position(
    model: LongMoE,
    tokenizer: Tokenizer,
    max_len: int,
    window: int,
    n_docs: int = 4,
    bucket: int | None = None,
    chunk: int = DEFAULT_CHUNK,
    data: str | Path | None = None,
) -> dict[str, Any]:
    """Mean loss per position bucket over ``n_docs`` documents of ``max_len`` tokens."""
    if max_len < 2 or window < 1:
        raise ValueError(
            f"max_len={max_len} and window={window} are invalid: expected max_len >= 2, window >= 1"
        )
    bucket = bucket or max(1, max_len // 32)
    docs, concatenated = long_documents(tokenizer, max_len, n_docs, data)
    total = torch.zeros(max_len - 1, dtype=torch.float64)
    for ids in docs:
        total += position_losses(model, ids, chunk).double()
    mean = total / len(docs)  # [max_len - 1]; index p predicts token p + 1 with p + 1 tokens of context
    buckets = []
    for s in range(0, max_len - 1, bucket):
        seg = mean[s : s + bucket]
        loss = float(seg.mean())
        buckets.append({"start": s + 1, "end": s + len(seg), "loss": loss, "ppl": math.exp(min(loss, 50.0))})
    inside = float(mean[: min(window, max_len) - 1].mean())
    beyond = float(mean[window - 1 :].mean()) if max_len > window else float("nan")
    end_of_window = float(mean[max(0, window - 1 - bucket) : window - 1].mean()) if window > 1 else inside
    return {
        "max_len": max_len,
        "window": window,
        "bucket": bucket,
        "n_docs": len(docs),
        "concatenated": concatenated,
        "buckets": buckets,
        "inside": inside,
        "beyond": beyond,
        "end_of_window": end_of_window,
        "beyond_over_end": beyond / end_of_window
        if end_of_window == end_of_window and end_of_window
        else None,
    }


def markdown_ppl(res: dict[str, Any]) -> str:
    lines = [
        f"Loss by position (window {res['window']}, {res['n_docs']} documents of {res['max_len']} tokens"
        + (", some concatenated" if res["concatenated"] else "")
        + ")",
        "",
        "| positions | loss | ppl |",
        "|---|---|---|",
    ]
    for b in res["buckets"]:
        mark = " (beyond window)" if b["start"] > res["window"] else ""
        lines.append(f"| {b['start']}-{b['end']}{mark} | {b['loss']:.3f} | {b['ppl']:.1f} |")
    lines += ["", f"inside window: {res['inside']:.3f}, beyond: {res['beyond']:.3f}"]
    return "\n".join(lines) + "\n"


@torch.no_grad()
def answer_loss(
    model: LongMoE, tokenizer: Tokenizer, prompt: str, answer: str, chunk: int = DEFAULT_CHUNK
) -> float:
    """Mean next-token loss of the answer tokens given the prompt (teacher forcing).

    A graded signal where generation accuracy is all zeros (small or briefly trained models): it
    falls as soon as the model starts to use the context, long before greedy answers are exact.
    """
    p_ids = tokenizer.encode(prompt, bos=True)
    a_ids = tokenizer.encode(" " + answer)
    losses = position_losses(model, p_ids + a_ids, chunk)  # [len - 1]
    return float(losses[len(p_ids) - 1 :].mean())
