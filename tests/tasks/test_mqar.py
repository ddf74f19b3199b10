"""MQAR generator: labels only on answers, power-law distances inside the row, no answer leakage,
determinism by seed, clear errors on impossible settings."""

from __future__ import annotations

import pytest
import torch

from longmoe.config import IGNORE_INDEX
from longmoe.tasks.base import TaskError
from longmoe.tasks.mqar import (
    FILLER,
    answer_accuracy,
    key_range,
    max_distance,
    mqar,
    placed,
    query_slots,
    slot_weights,
)


def test_layout_and_labels_only_on_answers():
    b = mqar(seed=1, n=32, vocab_size=128, seq_len=96, n_pairs=8)
    assert b.input_ids.shape == b.labels.shape == (32, 96) and b.distance.shape == (32, 8)
    lo, hi = key_range(128)
    for ids, lab in zip(b.input_ids.tolist(), b.labels.tolist()):
        keys, values = ids[0:16:2], ids[1:16:2]
        assert len(set(keys)) == 8 and all(lo <= k < hi for k in keys)
        assert len(set(values)) == 8 and all(hi <= v < 128 for v in values)
        pair = dict(zip(keys, values))
        answered = [t for t, y in enumerate(lab) if y != IGNORE_INDEX]
        assert len(answered) == 8, "one answer per query, nothing else labelled"
        assert all(t >= 16 and (t - 16) % 2 == 0 for t in answered), "answers sit on query keys"
        for t in answered:
            assert lab[t] == pair[ids[t]] and ids[t + 1] == lab[t], "the label is the key's value"
        asked = [ids[t] for t in answered]
        assert sorted(asked) == sorted(keys), "every key asked exactly once"
        rest = [x for t, x in enumerate(ids[16:], 16) if t not in answered and t - 1 not in answered]
        assert set(rest) <= {FILLER}, "unused slots hold the filler"


def test_no_answer_leakage():
    """Before its query, a queried value occurs only right after its key in the pair region."""
    b = mqar(seed=2, n=64, vocab_size=64, seq_len=64, n_pairs=12, n_queries=6)
    for ids, lab in zip(b.input_ids.tolist(), b.labels.tolist()):
        for t, y in enumerate(lab):
            if y == IGNORE_INDEX:
                continue
            seen = [s for s in range(t) if ids[s] == y]
            assert len(seen) == 1 and seen[0] < 24 and ids[seen[0] - 1] == ids[t]
            assert ids[:t].count(ids[t]) == 1, "the key was not asked before"


def test_distances_follow_the_power_law_and_fit():
    n, T, P, alpha = 4000, 256, 4, 0.1
    b = mqar(seed=3, n=n, vocab_size=64, seq_len=T, n_pairs=P, n_queries=1, alpha=alpha)
    pos = (b.labels != IGNORE_INDEX).nonzero()[:, 1]
    assert (pos + 1 < T).all() and (b.distance > 0).all() and (b.distance < T).all()
    slot = (pos - 2 * P) // 2
    slots = query_slots(T, P)
    freq = torch.bincount(slot, minlength=slots).double() / n
    p = slot_weights(slots, alpha)
    p = p / p.sum()
    # a single query per row: slot frequencies are the normalised weights (within sampling noise)
    se = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * se + 1e-3).all()
    assert freq[0] > 4 * freq[10] > 0, "short distances dominate"
    # distance = query position minus its key's position in the pair region
    ids = b.input_ids
    key_pos = pos - b.distance[:, 0]
    assert (ids[torch.arange(n), key_pos] == ids[torch.arange(n), pos]).all()
    # alpha = 1 is uniform over the slots
    u = mqar(seed=3, n=n, vocab_size=64, seq_len=T, n_pairs=P, n_queries=1, alpha=1.0)
    us = ((u.labels != IGNORE_INDEX).nonzero()[:, 1] - 2 * P) // 2
    assert abs(us.double().mean() - (slots - 1) / 2) < 2.0


def test_longer_rows_spread_queries_further():
    short = mqar(seed=4, n=256, vocab_size=256, seq_len=64, n_pairs=8)
    long = mqar(seed=4, n=256, vocab_size=256, seq_len=1024, n_pairs=8)
    assert long.distance.double().mean() > 4 * short.distance.double().mean()


def test_deterministic_by_seed():
    a = mqar(seed=5, n=8, vocab_size=100, seq_len=50, n_pairs=5)
    b = mqar(seed=5, n=8, vocab_size=100, seq_len=50, n_pairs=5)
    c = mqar(seed=6, n=8, vocab_size=100, seq_len=50, n_pairs=5)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.input_ids, c.input_ids)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"seq_len": 20, "n_pairs": 8}, "seq_len=20 is too short"),
        ({"vocab_size": 16, "n_pairs": 8}, "too many for vocab_size=16"),
        ({"n_queries": 9}, "n_queries=9"),
        ({"alpha": 0.0}, "alpha=0.0"),
        ({"n_pairs": 0}, "n_pairs=0"),
    ],
)
def test_impossible_settings_fail_clearly(kwargs, match):
    args = {"seed": 0, "n": 2, "vocab_size": 64, "seq_len": 64, "n_pairs": 8} | kwargs
    with pytest.raises(TaskError, match=match):
        mqar(**args)


def test_answer_accuracy_counts_answers_only():
    labels = torch.tensor([[IGNORE_INDEX, 3, IGNORE_INDEX, 1]])
    logits = torch.zeros(1, 4, 5)
    logits[0, 1, 3] = 1.0  # right
    logits[0, 3, 2] = 1.0  # wrong
    assert answer_accuracy(logits, labels) == (1, 2)


def test_near_placement_is_a_training_row_after_filler():
    """ "near": filler, then a row of the training layout at the end; answers and distances are the
    short row's, shifted."""
    short = mqar(seed=7, n=8, vocab_size=64, seq_len=64, n_pairs=8)
    b = placed(seed=7, n=8, vocab_size=64, seq_len=1000, n_pairs=8, placement="near", block_len=64)
    assert b.input_ids.shape == (8, 1000) and (b.input_ids[:, :936] == FILLER).all()
    assert torch.equal(b.input_ids[:, 936:], short.input_ids) and torch.equal(b.labels[:, 936:], short.labels)
    assert (b.labels[:, :936] == IGNORE_INDEX).all() and torch.equal(b.distance, short.distance)
    assert int(b.distance.max()) <= max_distance(64, 8)


def test_uniform_placement_spreads_queries_over_the_whole_row():
    """ "uniform": pairs first, query slots drawn uniformly: about half the queries lie in the second
    half of the row, and the mean distance is about half the row (the power law keeps them near)."""
    T, P = 2048, 8
    b = placed(seed=8, n=200, vocab_size=64, seq_len=T, n_pairs=P, placement="uniform", block_len=64)
    pos = (b.labels != IGNORE_INDEX).nonzero()[:, 1]
    assert pos.numel() == 200 * P and 0.45 < float((pos >= T // 2).double().mean()) < 0.55
    assert 0.4 * T < float(b.distance.double().mean()) < 0.6 * T
    near = mqar(seed=8, n=200, vocab_size=64, seq_len=T, n_pairs=P)
    assert float(near.distance.double().mean()) < 0.25 * T, "the training law keeps queries close"
    with pytest.raises(TaskError, match="placement"):
        placed(seed=0, n=1, vocab_size=64, seq_len=T, n_pairs=P, placement="far", block_len=64)
    with pytest.raises(TaskError, match="block_len"):
        placed(seed=0, n=1, vocab_size=64, seq_len=32, n_pairs=P, placement="near", block_len=64)
