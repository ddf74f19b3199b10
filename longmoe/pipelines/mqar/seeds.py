"""The sweep's three disjoint row sources: training, validation and test.

Every MQAR batch is a pure function of one generator seed (``tasks.mqar.mqar(seed, ...)``). Training
steps use ``train_seed(cell_seed, step) < VALIDATION_SEED_BASE`` (fresh rows each step); the
validation rows (early stopping and the choice of learning rate) use ``VALIDATION_SEED_BASE +
seq_len``; the test rows (every reported accuracy) use ``TEST_SEED_BASE + seq_len`` (the long-row
stage's, ``long_test_seed``, a band of that range per placement). The three ranges
are pairwise disjoint, so the reported number is measured on rows no selection step saw
(``tests/test_seed_ranges.py`` checks it against these functions).

All three stay below ``SEED_LIMIT = 2**32``: torch's CPU generator keeps only the low 32 bits of a
seed, so ``1 << 40`` draws what ``0`` draws. (The committed pre-protocol sweep scored on rows seeded
``(1 << 40) + seq_len``: its 64-token held-out rows had the key draws of training step 64 of every
seed-0 cell.)
"""

from __future__ import annotations

SEED_LIMIT = 1 << 32  # torch.Generator.manual_seed keeps the low 32 bits on CPU
STEP_STRIDE = 1_000_003  # a cell seed's training steps: [seed * STEP_STRIDE, seed * STEP_STRIDE + steps)
MAX_STEPS = STEP_STRIDE  # more steps would run into the next cell seed's rows
VALIDATION_SEED_BASE = 1 << 31
MAX_CELL_SEED = VALIDATION_SEED_BASE // STEP_STRIDE - 1  # 2,146: every training seed < VALIDATION_SEED_BASE
MAX_SEQ_LEN = 1 << 30  # validation seeds stay below TEST_SEED_BASE, test seeds below SEED_LIMIT
TEST_SEED_BASE = VALIDATION_SEED_BASE + MAX_SEQ_LEN
# the long-row stage's test rows: one band of the test range per placement, above the sweep's lengths
MAX_LONG_LEN = MAX_SEQ_LEN // 4
LONG_PLACEMENTS = ("near", "uniform")  # tasks.mqar.PLACEMENTS, in band order


def train_seed(cell_seed: int, step: int) -> int:
    """The training batch of ``step`` for a cell seeded ``cell_seed``."""
    return cell_seed * STEP_STRIDE + step


def validation_seed(seq_len: int) -> int:
    """The validation rows of length ``seq_len`` (early stopping, learning-rate choice)."""
    return VALIDATION_SEED_BASE + seq_len


def test_seed(seq_len: int) -> int:
    """The test rows of length ``seq_len`` (every reported accuracy)."""
    return TEST_SEED_BASE + seq_len


def long_test_seed(seq_len: int, placement: str) -> int:
    """The long-row stage's test rows of ``seq_len`` tokens and ``placement``: inside ``test_range``,
    apart from every ``test_seed`` of a length below ``MAX_LONG_LEN`` and from the other placement's."""
    if not 0 < seq_len <= MAX_LONG_LEN or placement not in LONG_PLACEMENTS:
        raise ValueError(f"long rows: seq_len={seq_len} must be in [1, {MAX_LONG_LEN}], placement one of "
                         f"{LONG_PLACEMENTS}, got {placement!r}")  # fmt: skip
    return TEST_SEED_BASE + (LONG_PLACEMENTS.index(placement) + 1) * MAX_LONG_LEN + seq_len


def train_range(cell_seeds: list[int], steps: int) -> range:
    """Every training seed the sweep can draw with these cell seeds and step budget."""
    return range(0, max(cell_seeds) * STEP_STRIDE + steps)


def validation_range() -> range:
    return range(VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + MAX_SEQ_LEN)


def test_range() -> range:
    return range(TEST_SEED_BASE, TEST_SEED_BASE + MAX_SEQ_LEN)
