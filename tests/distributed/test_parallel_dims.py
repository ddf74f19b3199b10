"""ParallelDims: validation names the flags and the world size; parsing; process helpers without torchrun."""

from __future__ import annotations

import pytest

from longmoe.config import ConfigError
from longmoe.distributed.parallel_dims import ParallelDims, backend_for, is_distributed, rank, world_size


def test_product_must_equal_world_size():
    dims = ParallelDims(dp_shard=2, ep=2, cp=1)
    dims.validate(4)
    with pytest.raises(ConfigError) as e:
        dims.validate(8)
    msg = str(e.value)
    assert "--dp-shard 2" in msg and "--ep 2" in msg and "--cp 1" in msg and "world size is 8" in msg


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_degrees_must_be_positive_integers(bad):
    with pytest.raises(ConfigError, match="--ep"):
        ParallelDims(ep=bad)


def test_for_world_fills_dp_shard():
    assert ParallelDims.for_world(8, ep=2) == ParallelDims(4, 2, 1)
    assert ParallelDims.for_world(8, ep=2).data_degree == 8
    assert ParallelDims.for_world(8, cp=4).data_degree == 2
    with pytest.raises(ConfigError, match="does not divide"):
        ParallelDims.for_world(6, ep=4)


def test_parse():
    assert ParallelDims.parse("dp_shard=8,ep=64,cp=16") == ParallelDims(8, 64, 16)
    assert ParallelDims.parse("ep=4") == ParallelDims(1, 4, 1)
    assert ParallelDims.parse("dp-shard=2") == ParallelDims(2, 1, 1)
    for bad in ("tp=2", "ep", "ep=x"):
        with pytest.raises(ConfigError, match="--parallel"):
            ParallelDims.parse(bad)


def test_single_process_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert not is_distributed() and world_size() == 1 and rank() == 0
    assert backend_for("cpu") == "gloo" and backend_for("cuda") == "nccl"
