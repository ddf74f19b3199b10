"""The agent tasks' seed blocks: training, validation and test, pairwise disjoint.

* training ``[0, HELD_OUT_SEED_BASE)``: SFT demonstrations (``train/sft.py``) and RL training tasks
  (``rl/trainer.task_seeds``) draw from it;
* test ``[HELD_OUT_SEED_BASE, VALIDATION_SEED_BASE)``: every reported held-out number
  (``eval/agent/harness.held_out_seeds(n, offset)`` with ``offset < TEST_BLOCK``); the SFT drift probe
  reads a few of these too (a monitor that selects nothing);
* validation ``[VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + TEST_BLOCK)``: choices made on held-out
  tasks (the agent recipe's RL learning rate), so no test task ever selects anything. The eval
  harness reaches it through its offset: ``held_out_seeds(n, validation_offset(k))``.

``tests/test_seed_ranges.py`` checks these against the functions that draw the seeds.
"""

from __future__ import annotations

import random

from longmoe.envs.base import HELD_OUT_SEED_BASE

TEST_BLOCK = HELD_OUT_SEED_BASE  # test seeds: HELD_OUT_SEED_BASE + offset, offset < TEST_BLOCK
VALIDATION_SEED_BASE = HELD_OUT_SEED_BASE + TEST_BLOCK
TRAIN_SEEDS = range(0, HELD_OUT_SEED_BASE)
TEST_SEEDS = range(HELD_OUT_SEED_BASE, VALIDATION_SEED_BASE)
VALIDATION_SEEDS = range(VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + TEST_BLOCK)


def train_task_seed(rng: random.Random) -> int:
    """One training task seed (uniform over ``TRAIN_SEEDS``)."""
    return rng.randrange(TRAIN_SEEDS.stop)


def validation_offset(offset: int = 0) -> int:
    """The eval harness's ``offset`` (``held_out_seeds(n, offset)``) that lands on the validation block."""
    if not 0 <= offset < TEST_BLOCK:
        raise ValueError(f"offset={offset} is invalid: expected 0 <= offset < {TEST_BLOCK}")
    return VALIDATION_SEED_BASE - HELD_OUT_SEED_BASE + offset
