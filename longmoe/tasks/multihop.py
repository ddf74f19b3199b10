"""Multi-hop tracing and aggregation: answers that need several far-apart facts combined.

- ``chain``: variable tracking (RULER ``vt``): ``VAR ABCDE = 48213.`` then ``VAR FGHIJ = VAR ABCDE.``
  ... ; the answer is every variable that ends up holding the value. A distractor chain with another
  value has the same shape, so following the references (not pattern matching) is needed.
- ``count``: delivery log lines scattered through the context; how many mention one kind of goods.
- ``mostfreq``: which kind of goods occurs most often (the maximum is unique).
Aggregation variants spread their lines uniformly, so ``depth`` does not apply (metadata depth None).
"""

from __future__ import annotations

import random

from longmoe.tasks.base import PLACES, SHORT_LENGTH, Spec, distinct, key_name, number, var_name

VARIANTS = ("chain", "count", "mostfreq")
MIN_HOPS, MAX_HOPS = 2, 4  # 1-2 when short
N_GOODS = 4  # kinds of goods in the aggregation log (one fewer, and fewer lines, when short)

_DELIVERY = "Delivery note: a crate of {goods} arrived at {place}."


def _chain(rng: random.Random, names: list[str], value: str) -> list[str]:
    lines = [f"VAR {names[0]} = {value}."]
    lines += [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
    return lines


def make_spec(rng: random.Random, variant: str, depth: float, length: int) -> Spec:
    short = length < SHORT_LENGTH
    if variant == "chain":
        hops = rng.randint(1, 2) if short else rng.randint(MIN_HOPS, MAX_HOPS)
        names = distinct(rng, 2 * (hops + 1), var_name)
        target, other = names[: hops + 1], names[hops + 1 :]
        value, other_value = distinct(rng, 2, lambda r: number(r, 5))
        lines = _chain(rng, target, value)
        decoy = _chain(rng, other, other_value)
        # Target links in order after the root (placed at depth); the decoy anywhere.
        tail = sorted(rng.uniform(depth, 1.0) for _ in range(hops))
        needles = [(depth, lines[0])] + list(zip(tail, lines[1:]))
        needles += [(rng.random(), s) for s in decoy]
        q = (
            f"Which variables are assigned the value {value}, directly or through other variables? "
            "List all of them."
        )
        return Spec(needles, q, target, {"hops": hops}, forbidden=names + [value, other_value])
    if variant in ("count", "mostfreq"):
        goods = distinct(rng, N_GOODS - short, key_name)
        most = 4 if short else 7  # most lines of one kind
        if variant == "count":
            counts = [rng.randint(1, most - 1) for _ in goods]
        else:  # a unique maximum
            top = rng.randint(most - 2, most)
            counts = [top] + [rng.randint(1, top - 1) for _ in goods[1:]]
        needles = []
        for g, c in zip(goods, counts):
            needles += [(rng.random(), _DELIVERY.format(goods=g, place=rng.choice(PLACES))) for _ in range(c)]
        # Identical sentences cannot be told apart: number the notes in reading order.
        needles.sort()
        needles = [
            (p, s.replace("Delivery note:", f"Delivery note {i + 1}:")) for i, (p, s) in enumerate(needles)
        ]
        if variant == "count":
            q = f"How many crates of {goods[0]} arrived in total, according to the delivery notes?"
            answers = [str(counts[0])]
        else:
            q = "Which kind of goods arrived in the most crates, according to the delivery notes?"
            answers = [goods[0]]
        meta = {"depth": None, "hops": counts[0], "counts": dict(zip(goods, counts)), "target": goods[0]}
        return Spec(needles, q, answers, meta, forbidden=goods)
    raise ValueError(f"multihop variant {variant!r} is unknown: expected one of {VARIANTS}")
