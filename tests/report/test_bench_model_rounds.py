"""bench.model over alternating rounds: medians per side, and the per-round ratio's median and range,
oriented so that above 1 means longmoe is faster (issue 50: a verdict rests on rounds, not one sample)."""

from __future__ import annotations

from bench.model import combine, table


def _round(ours_tok_s: float, peer_tok_s: float, ms_1k: float, ms_16k: float) -> dict:
    return {
        "train": [{"T": 1024, "ours_tok_s": ours_tok_s, "peer_tok_s": peer_tok_s}],
        "prefill": [{"T": 1024, "ours_tok_s": 10.0, "peer_tok_s": 5.0}],
        "decode": [
            {"context": 1024, "ours_ms": ms_1k, "peer_ms": 4 * ms_1k, "cache_bytes": 1},
            {"context": 16384, "ours_ms": ms_16k, "peer_ms": 8 * ms_1k, "cache_bytes": 2},
        ],
    }


def test_ratios_are_per_round_and_above_one_means_longmoe_is_faster():
    res = combine([_round(100, 10, 2.0, 2.4), _round(120, 10, 2.0, 3.0), _round(90, 10, 2.0, 2.2)])
    tr = res["train"][0]
    assert tr["ours_tok_s"] == 100 and tr["speedup"] == {"median": 10.0, "min": 9.0, "max": 12.0}
    assert len(tr["rounds"]) == 3
    assert res["decode"][0]["speedup"]["median"] == 4.0  # the peer's ms over longmoe's
    assert res["decode_growth"]["ours"] == {"median": 1.2, "min": 1.1, "max": 1.5}


def test_a_verdict_needs_three_rounds_and_a_range_wholly_on_one_side():
    one = table(combine([_round(100, 10, 2.0, 2.4)]), 1, 2, 1e11, 1000)
    assert "no verdict (1 sample(s))" in one
    three = combine([_round(100, 10, 2.0, 2.4), _round(120, 10, 2.0, 3.0), _round(90, 10, 2.0, 2.2)])
    md = table(three, 3, 2, 1e11, 1000)
    assert "training >= 10x transformers (every T): not settled" in md  # 9x..12x crosses 10x
    assert "decode at 16K within 1.3x of 1K: not settled" in md  # 1.1x..1.5x crosses 1.3x
    fast = combine([_round(200, 10, 2.0, 2.2)] * 3)
    assert "training >= 10x transformers (every T): met" in table(fast, 3, 2, 1e11, 1000)
