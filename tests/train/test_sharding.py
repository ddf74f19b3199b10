"""train/sharding: windows dealt to data ranks cover the batch exactly once, balanced, with valid offsets."""

from __future__ import annotations

import pytest
import torch

from longmoe.config import ConfigError
from longmoe.data.packing import Window, collate
from longmoe.data.stages import CurriculumStage
from longmoe.train.sharding import assign_windows, check_batches, shard_batch, window_lengths


def test_assign_windows_balances_tokens_and_covers_each_window_once():
    lengths = [64, 32, 32, 32, 32]  # one long window + four replay windows
    parts = assign_windows(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(5))
    assert parts == [[0, 3], [1, 2, 4]]  # 96 tokens each, in batch order
    assert assign_windows([8] * 4, 2) == [[0, 2], [1, 3]]


def test_shard_batch_repacks_windows_with_their_own_offsets():
    g = torch.Generator().manual_seed(0)
    lengths, segs = [6, 4, 4], [[2, 4], [4], [1, 1, 2]]
    windows = [
        Window(torch.randint(0, 50, (n,), generator=g).tolist(), list(range(n)), s)
        for n, s in zip(lengths, segs)
    ]
    batch = collate(windows)
    shards = [shard_batch(batch, lengths, r, 2) for r in range(2)]
    for r, sh in enumerate(shards):
        mine = assign_windows(lengths, 2)[r]
        ref = collate([windows[i] for i in mine])
        assert torch.equal(sh.input_ids, ref.input_ids) and torch.equal(sh.labels, ref.labels)
        assert sh.cu_seqlens.tolist() == ref.cu_seqlens.tolist()
    assert sum(sh.input_ids.shape[1] for sh in shards) == batch.input_ids.shape[1]
    assert shard_batch(batch, lengths, 0, 1) is batch


def test_every_batch_needs_a_window_per_data_rank():
    s = CurriculumStage("x", window=64, tokens=640, batch_size=1, replay_fraction=0.5, replay_window=32)
    assert window_lengths(s) == [64, 32, 32]
    check_batches([s], 3)
    with pytest.raises(ConfigError, match=r"stages\[0\] \(x\).*3 windows.*4 data-parallel ranks"):
        check_batches([s], 4)
