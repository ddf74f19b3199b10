"""Multi-query associative recall (MQAR, Zoology: Arora et al. 2023) as token ids.

A row of ``seq_len`` tokens is ``P = n_pairs`` key-value pairs ``k_1 v_1 ... k_P v_P``, then a query
region of ``(seq_len - 2P) // 2`` two-token slots. ``n_queries`` of the slots (default: every pair's
key, each key asked once) hold a key followed by its value; the other slots hold the filler token 0.
Slot ``s`` (0-based, counted from the start of the query region) is picked with weight
``(s + 1)^(alpha - 1)`` and without replacement (a power law: most queries come soon after the pairs, a
tail comes much later), so ``alpha`` near 0 is Zoology's skew and ``alpha = 1`` is uniform.

The label of a query key's position is its value (labels are already shifted, as the model takes
them: position ``t`` predicts token ``t + 1``); every other label is ``IGNORE_INDEX``, so loss and
accuracy are measured on answers only. Keys come from ``[1, vocab_size // 2)``, values from
``[vocab_size // 2, vocab_size)``, both drawn without replacement per row, and each key is asked at
most once, so a queried value occurs nowhere before its query except right after its key in the pair
region: recalling it needs that pair.

Long rows (``placed``) put the same task into a row of any length two ways: ``"uniform"`` draws the
query slots uniformly over the whole row after the pairs (``alpha = 1``: a query sits anywhere, on
average half the row from its pair), ``"near"`` ends a row of filler with one row of the training
layout (pairs, then queries at power-law slots), so the queries sit near their pairs after a long
stretch of filler. A causal model reading ``"near"`` rows sees the whole filler; with the pairs first
and the filler after the queries, a longer row would read exactly like the short one.

Everything is a pure function of the arguments (a ``torch.Generator`` seeded with ``seed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from longmoe.config import IGNORE_INDEX
from longmoe.tasks.base import TaskError

FILLER = 0  # the token of unused query slots
DEFAULT_ALPHA = 0.1  # power-law exponent of the query slots (Zoology's default is 0.01)
PLACEMENTS = ("near", "uniform")  # long rows: queries near their pairs at the row's end, or anywhere
UNIFORM = 1.0  # alpha of uniformly drawn query slots


@dataclass(frozen=True)
class MQARBatch:
    """``input_ids [n, seq_len]``, ``labels [n, seq_len]`` (values at query keys, else IGNORE_INDEX),
    ``distance [n, n_queries]``: tokens from each query key back to its key in the pair region."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    distance: torch.Tensor


def key_range(vocab_size: int) -> tuple[int, int]:
    """Token ids ``[lo, hi)`` that keys are drawn from (values use ``[hi, vocab_size)``)."""
    return 1, vocab_size // 2


def query_slots(seq_len: int, n_pairs: int) -> int:
    """Two-token query slots after ``n_pairs`` pairs in a row of ``seq_len`` tokens."""
    return max(0, (seq_len - 2 * n_pairs) // 2)


def max_distance(seq_len: int, n_pairs: int) -> int:
    """The longest key-to-query distance a row of ``seq_len`` tokens can hold: the first pair asked in
    the last query slot (``MQARBatch.distance`` never exceeds it)."""
    return 2 * n_pairs + 2 * (query_slots(seq_len, n_pairs) - 1)


def check_settings(vocab_size: int, seq_len: int, n_pairs: int, n_queries: int, alpha: float) -> None:
    """A ``TaskError`` naming the setting that makes the task impossible."""
    for name, v in (("vocab_size", vocab_size), ("seq_len", seq_len), ("n_pairs", n_pairs)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise TaskError(f"{name}={v!r} is invalid: expected a positive integer")
    lo, hi = key_range(vocab_size)
    if n_pairs > hi - lo or n_pairs > vocab_size - hi:
        raise TaskError(
            f"n_pairs={n_pairs} is too many for vocab_size={vocab_size}: keys come from {hi - lo} "
            f"token ids and values from {vocab_size - hi}, each used once per row"
        )
    slots = query_slots(seq_len, n_pairs)
    if not isinstance(n_queries, int) or not 1 <= n_queries <= n_pairs:
        raise TaskError(f"n_queries={n_queries!r} is invalid: expected an integer in [1, n_pairs={n_pairs}]")
    if n_queries > slots:
        raise TaskError(
            f"seq_len={seq_len} is too short for {n_pairs} pairs and {n_queries} queries: the pairs take "
            f"{2 * n_pairs} tokens and leave {slots} two-token query slots; expected seq_len >= "
            f"{2 * n_pairs + 2 * n_queries}"
        )
    if not alpha > 0:
        raise TaskError(f"alpha={alpha!r} is invalid: expected a power-law exponent > 0")


def slot_weights(slots: int, alpha: float) -> torch.Tensor:
    """Unnormalised probability of each query slot: ``(s + 1)^(alpha - 1)``, ``[slots]``."""
    return torch.arange(1, slots + 1, dtype=torch.float64) ** (alpha - 1.0)


def mqar(
    seed: int,
    n: int,
    vocab_size: int,
    seq_len: int,
    n_pairs: int,
    alpha: float = DEFAULT_ALPHA,
    n_queries: int | None = None,
) -> MQARBatch:
    """``n`` MQAR rows; see the module docstring. ``n_queries`` defaults to ``n_pairs``."""
    q = n_pairs if n_queries is None else n_queries
    check_settings(vocab_size, seq_len, n_pairs, q, alpha)
    if not isinstance(n, int) or n < 0:
        raise TaskError(f"n={n!r} is invalid: expected a non-negative integer")
    g = torch.Generator().manual_seed(seed)
    P, lo, hi = n_pairs, *key_range(vocab_size)
    keys = torch.rand(n, hi - lo, generator=g).argsort(1)[:, :P] + lo  # [n, P] distinct per row
    values = torch.rand(n, vocab_size - hi, generator=g).argsort(1)[:, :P] + hi  # [n, P]
    slots = query_slots(seq_len, P)
    # weighted sampling without replacement: the top-q of log w + Gumbel noise
    gumbel = -torch.log(-torch.log(torch.rand(n, slots, generator=g, dtype=torch.float64)))
    slot = (slot_weights(slots, alpha).log() + gumbel).topk(q, dim=1).indices  # [n, q]
    asked = torch.rand(n, P, generator=g).argsort(1)[:, :q]  # which pair each query asks, [n, q]

    ids = torch.full((n, seq_len), FILLER, dtype=torch.long)
    ids[:, 0 : 2 * P : 2], ids[:, 1 : 2 * P : 2] = keys, values
    pos = 2 * P + 2 * slot  # [n, q] position of each query key
    qk, qv = keys.gather(1, asked), values.gather(1, asked)
    ids.scatter_(1, pos, qk)
    ids.scatter_(1, pos + 1, qv)
    labels = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.long)
    labels.scatter_(1, pos, qv)
    return MQARBatch(ids, labels, pos - 2 * asked)


def placed(
    seed: int,
    n: int,
    vocab_size: int,
    seq_len: int,
    n_pairs: int,
    placement: str,
    block_len: int,
    alpha: float = DEFAULT_ALPHA,
) -> MQARBatch:
    """``n`` rows of ``seq_len`` tokens with the queries placed by ``placement`` (module docstring):
    ``"uniform"`` is ``mqar(..., alpha=1)``; ``"near"`` is ``seq_len - block_len`` filler tokens, then
    ``mqar(seed, n, vocab_size, block_len, n_pairs, alpha)`` (``distance`` unchanged by the shift)."""
    if placement not in PLACEMENTS:
        raise TaskError(f"placement={placement!r} is invalid: expected one of {PLACEMENTS}")
    if placement == "uniform":
        return mqar(seed, n, vocab_size, seq_len, n_pairs, UNIFORM)
    if not isinstance(block_len, int) or not 0 < block_len <= seq_len:
        raise TaskError(f"block_len={block_len!r} is invalid: expected an integer in [1, seq_len={seq_len}]")
    b = mqar(seed, n, vocab_size, block_len, n_pairs, alpha)
    pad = seq_len - block_len
    ids = torch.cat([torch.full((n, pad), FILLER, dtype=torch.long), b.input_ids], dim=1)
    labels = torch.cat([torch.full((n, pad), IGNORE_INDEX, dtype=torch.long), b.labels], dim=1)
    return MQARBatch(ids, labels, b.distance)


def answer_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """``(correct, answers)``: greedy predictions ``logits [n, T, V]`` right at the answer labels."""
    mask = labels != IGNORE_INDEX
    correct = (logits.argmax(-1) == labels) & mask
    return int(correct.sum()), int(mask.sum())
