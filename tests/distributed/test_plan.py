"""distributed.plan (``longmoe inspect --parallel``): per-device memory shards with the world, EP
all-to-all bytes scale with ℓ = d/α, the CP search finds the smallest fitting power of two."""

from __future__ import annotations

import json

from longmoe.accounting import param_counts
from longmoe.cli import main
from longmoe.distributed.parallel_dims import ParallelDims
from longmoe.distributed.plan import memory_per_device, plan
from longmoe.memory import cache_accounting
from longmoe.presets import preset

FLAGSHIP = preset("flagship")
COUNTS, CACHE = param_counts(FLAGSHIP), cache_accounting(FLAGSHIP)


def test_weights_shard_over_every_device():
    total = sum(COUNTS.values())
    for dims in (ParallelDims(8, 64, 16), ParallelDims(1, 8, 1)):
        m = memory_per_device(FLAGSHIP, COUNTS, CACHE, dims, 1 << 20)
        assert abs(m["weights"] * dims.world_size - total * 2) <= 2 * dims.world_size  # bf16
        assert m["optimizer"] == 2 * m["weights"] and m["gradients"] == m["weights"]
    one = memory_per_device(FLAGSHIP, COUNTS, CACHE, ParallelDims(8, 64, 1), 1 << 20)
    sixteen = memory_per_device(FLAGSHIP, COUNTS, CACHE, ParallelDims(8, 64, 16), 1 << 20)
    assert sixteen["activations"] * 16 == one["activations"]  # CP splits the window's tokens


def test_all_to_all_bytes_follow_the_latent_width():
    p = plan(FLAGSHIP, COUNTS, CACHE, ParallelDims(8, 64, 16))
    a2a = p["all_to_all_bytes_per_token"]
    assert set(a2a) == {"1", "2", "4"}
    assert a2a["1"]["latent_dim"] == FLAGSHIP.d_model and a2a["4"]["latent_dim"] == FLAGSHIP.d_model // 4
    assert a2a["1"]["per_layer_forward"] == 4 * a2a["4"]["per_layer_forward"]
    # 24 experts × (dispatch + combine) × d bf16 numbers, 63/64 of them leave the device
    assert a2a["1"]["per_layer_forward"] == 24 * 2 * 7168 * 2 * 63 / 64
    assert (
        plan(FLAGSHIP, COUNTS, CACHE, ParallelDims(8, 1, 16))["all_to_all_bytes_per_token"]["1"][
            "per_layer_forward"
        ]
        == 0
    )  # no expert parallelism: nothing leaves the device


def test_cp_for_one_million_tokens_is_the_smallest_that_fits():
    budget = 80 * 2**30
    cp = plan(FLAGSHIP, COUNTS, CACHE, ParallelDims(8, 64, 1), device_memory=budget)["cp_for_1m_tokens"]
    assert cp is not None and cp & (cp - 1) == 0
    fits = lambda c: memory_per_device(FLAGSHIP, COUNTS, CACHE, ParallelDims(8, 64, c), 1 << 20)["total"]
    assert fits(cp) <= budget < fits(cp // 2)


def test_inspect_cli_parallel(capsys):
    assert main(["inspect", "--preset", "flagship", "--parallel", "dp_shard=8,ep=64,cp=16"]) == 0
    out = capsys.readouterr().out
    assert "8192 devices" in out and "α = 4" in out and "CP degree for a 1M-token window" in out
    assert main(["inspect", "--preset", "flagship", "--json", "--parallel", "ep=64"]) == 0
    assert json.loads(capsys.readouterr().out)["parallel"]["experts_per_device"] == 896 // 64
    assert main(["inspect", "--parallel", "tp=2"]) == 2
    assert "--parallel" in capsys.readouterr().err
