"""Synthetic long-context tasks: ``generate(task, n, length, seed, tokenizer, depth=None)``.

Shared by pretraining data (``longmoe.train.mix``), evaluation (``longmoe.eval``) and, next, RL
environments, so this package sits below all of them.

``FAMILIES`` is the one registry of task families (name -> module with ``VARIANTS`` and
``make_spec``); every other list of task names is derived from it. Task names are a family
(``niah``, ``multihop``, ``conflict``, ``recall``: items cycle through the family's variants) or
``family_variant`` for one variant (``niah_multikey``, ``conflict_authority``, ...). ``length`` is
the prompt length in tokens of ``tokenizer`` (context + question), ``depth`` the relative position
in [0, 1] of the key needle (None: drawn per item). Items are pure functions of their arguments:
the same seed gives the same items, and item ``i`` of ``n`` does not depend on ``n``.
"""

from __future__ import annotations

from types import ModuleType

from longmoe.data.tokenizer import Tokenizer
from longmoe.tasks import conflict, multihop, niah, recall
from longmoe.tasks.base import LENGTH_TOL, TaskError, TaskItem, TooShortError, filler_pool, make_item

# The registry: family name -> module (``VARIANTS``, ``make_spec``)
FAMILIES: dict[str, ModuleType] = {"niah": niah, "multihop": multihop, "conflict": conflict, "recall": recall}

# Every accepted task name -> (family, variants its items cycle through)
TASKS: dict[str, tuple[str, tuple[str, ...]]] = {}
for _fam, _mod in FAMILIES.items():
    TASKS[_fam] = (_fam, _mod.VARIANTS)
    for _v in _mod.VARIANTS:
        TASKS[f"{_fam}_{_v}"] = (_fam, (_v,))

__all__ = [
    "FAMILIES",
    "LENGTH_TOL",
    "TASKS",
    "TaskError",
    "TaskItem",
    "TooShortError",
    "filler_pool",
    "generate",
    "parse_tasks",
]


def parse_tasks(spec: str | list[str]) -> list[str]:
    """``"niah,conflict_latest"`` -> validated task names (clear error naming the bad one)."""
    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    if not names:
        raise TaskError("no task given: expected a comma-separated list from " + ", ".join(TASKS))
    for t in names:
        if t not in TASKS:
            raise TaskError(f"unknown task {t!r}: expected one of {', '.join(TASKS)}")
    return names


def generate(
    task: str, n: int, length: int, seed: int, tokenizer: Tokenizer, depth: float | None = None
) -> list[TaskItem]:
    """``n`` items of ``task``, each a prompt of ``length`` tokens (±2%) with its key fact at ``depth``."""
    if task not in TASKS:
        raise TaskError(f"unknown task {task!r}: expected one of {', '.join(TASKS)}")
    if not isinstance(n, int) or n < 0:
        raise TaskError(f"n={n!r} is invalid: expected a non-negative integer")
    if not isinstance(length, int) or length < 32:
        raise TaskError(f"length={length!r} is invalid: expected an integer number of tokens >= 32")
    family, variants = TASKS[task]
    make_spec = FAMILIES[family].make_spec
    out = []
    for i in range(n):
        variant = variants[(seed + i) % len(variants)]
        out.append(make_item(make_spec, family, variant, seed, i, length, depth, tokenizer))
    return out
