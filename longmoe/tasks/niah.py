"""Needle in a haystack (the RULER baseline): single, multi-key, multi-value and multi-query.

Needles are ``One of the special magic numbers for <key> is: <7 digits>.`` with random two-word keys;
the number is random, so it can only be read from the context.
"""

from __future__ import annotations

import random

from longmoe.tasks.base import SHORT_LENGTH, Spec, distinct, key_name, number, spread

VARIANTS = ("single", "multikey", "multivalue", "multiquery")
N_DISTRACTORS = 3  # multikey: other keys with their own numbers
N_VALUES = 4  # multivalue: numbers under the same key
N_QUERIES = 3  # multiquery: keys asked together
# Below SHORT_LENGTH tokens each multi-needle variant uses one needle fewer.

_NEEDLE = "One of the special magic numbers for {key} is: {value}."


def _join(keys: list[str]) -> str:
    return ", ".join(keys[:-1]) + f" and {keys[-1]}" if len(keys) > 1 else keys[0]


def make_spec(rng: random.Random, variant: str, depth: float, length: int) -> Spec:
    short = length < SHORT_LENGTH
    if variant in ("single", "multikey"):
        n_keys = 1 + ((N_DISTRACTORS - short) if variant == "multikey" else 0)
        keys = distinct(rng, n_keys, key_name)
        values = distinct(rng, n_keys, number)
        pos = spread(rng, depth, n_keys)
        needles = [(p, _NEEDLE.format(key=k, value=v)) for p, k, v in zip(pos, keys, values)]
        q = f"What is the special magic number for {keys[0]} mentioned in the provided text?"
        return Spec(needles, q, [values[0]], {"n_distractors": n_keys - 1}, forbidden=keys + values)
    if variant == "multivalue":
        key = key_name(rng)
        n_values = N_VALUES - short
        values = distinct(rng, n_values, number)
        pos = spread(rng, depth, n_values)
        needles = [(p, _NEEDLE.format(key=key, value=v)) for p, v in zip(pos, values)]
        in_order = [v for _, v in sorted(zip(pos, values))]  # answers in reading order
        q = f"What are all the special magic numbers for {key} mentioned in the provided text?"
        return Spec(needles, q, in_order, {"n_values": n_values}, forbidden=[key, *values])
    if variant == "multiquery":
        n_queries = N_QUERIES - short
        keys = distinct(rng, n_queries, key_name)
        values = distinct(rng, n_queries, number)
        pos = spread(rng, depth, n_queries)
        needles = [(p, _NEEDLE.format(key=k, value=v)) for p, k, v in zip(pos, keys, values)]
        q = f"What are the special magic numbers for {_join(keys)} mentioned in the provided text?"
        return Spec(needles, q, values, {"n_queries": n_queries}, forbidden=keys + values)
    raise ValueError(f"niah variant {variant!r} is unknown: expected one of {VARIANTS}")
