"""Key-information recall: several facts spread evenly across the document, asked for together.

Fact ``i`` sits at ``(depth + i / n) mod 1``, so the facts always cover the whole context and
``depth`` rotates where the first one is. The answers are listed in the order they are asked.
"""

from __future__ import annotations

import random

from longmoe.tasks.base import SHORT_LENGTH, Spec, distinct, key_name, number

VARIANTS = ("facts",)
MIN_FACTS, MAX_FACTS = 3, 5  # 2-3 when short

_FACT = "Archive note: the locker code of {key} is {value}."


def make_spec(rng: random.Random, variant: str, depth: float, length: int) -> Spec:
    short = length < SHORT_LENGTH
    if variant not in VARIANTS:
        raise ValueError(f"recall variant {variant!r} is unknown: expected one of {VARIANTS}")
    n = rng.randint(2, 3) if short else rng.randint(MIN_FACTS, MAX_FACTS)
    keys = distinct(rng, n, key_name)
    values = distinct(rng, n, lambda r: number(r, 6))
    pos = [(depth + i / n) % 1.0 for i in range(n)]
    needles = [(p, _FACT.format(key=k, value=v)) for p, k, v in zip(pos, keys, values)]
    asked = list(range(n))
    rng.shuffle(asked)
    names = ", ".join(keys[i] for i in asked)
    q = f"What are the locker codes of {names}? Give them in this order, separated by commas."
    return Spec(needles, q, [values[i] for i in asked], {"n_facts": n}, forbidden=keys + values)
