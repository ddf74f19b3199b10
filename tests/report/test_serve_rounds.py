"""The serving benchmarks over alternating rounds (issue 50): bench.serve's decode growth, bench.rollout's
sessions vs re-prefill, and their report-card headlines. Each ratio is taken per round and reported as its
median and [min, max], oriented as the one-sample number was; a file written before rounds still renders
with its one-sample text."""

from __future__ import annotations

from bench.common import range_cell, spread
from bench.rollout import combine as rollout_combine
from bench.serve_decode import combine_decode
from longmoe.report.rules import violations
from longmoe.report.serve_headlines import load, rollout, serve, serve_prefix


def test_spread_is_the_median_and_range_over_rounds():
    s = spread([1.5, 1.1, 1.2])
    assert s == {"median": 1.2, "min": 1.1, "max": 1.5}
    assert range_cell(s) == "1.20 [1.10, 1.50]"


def _decode_round(h1: float, h2: float) -> dict[int, dict]:
    return {
        1024: {"hybrid_ms": h1, "pure_mla_ms": 5.0, "peer_ms": 4.0, "peer_prefill_s": 0.1},
        32768: {"hybrid_ms": h2, "pure_mla_ms": 10.0, "peer_ms": 16.0, "peer_prefill_s": 2.0},
    }


def test_decode_growth_is_last_over_first_context_per_round():
    res = combine_decode(
        [_decode_round(5.0, 6.0), _decode_round(4.0, 6.0), _decode_round(5.0, 5.5)], [1024, 32768]
    )
    hy = res["decode_ratio_range"]["hybrid"]
    assert (hy["min"], hy["median"], hy["max"]) == (1.1, 1.2, 1.5)  # growth > 1: slower at the long context
    assert res["decode_ratio_last_first"] == {"hybrid": 1.2, "pure_mla": 2.0, "peer": 4.0}
    # the per-context values are medians over rounds under the keys one round had; every round is kept
    assert res["decode"][0]["hybrid_ms"] == 5.0 and len(res["decode"][0]["rounds"]) == 3
    assert res["decode"][1]["context"] == 32768 and res["decode"][1]["peer_ms"] == 16.0


def _rollout_round(session_tok_s: float, reprefill_tok_s: float) -> dict:
    def run(mode: str, tok_s: float, prefilled: int) -> dict:
        same = {"identical": 1, "episodes": 1, "diverged": []}
        return {"mode": mode, "episodes": 1, "wall_s": 100 / tok_s, "tokens": 100, "generated": 10,
                "prefilled": prefilled, "tok_s": tok_s, "gen_tok_s": tok_s / 10, "same_as_session": same,
                "speedup_vs_reprefill": tok_s / reprefill_tok_s}  # fmt: skip

    return {
        (1, "session"): run("session", session_tok_s, 50),
        (1, "prefix"): run("prefix", reprefill_tok_s, 80),
        (1, "re-prefill"): run("re-prefill", reprefill_tok_s, 200),
    }


def test_rollout_speedup_is_sessions_over_reprefill_per_round_in_the_cited_row_order():
    rows = rollout_combine([_rollout_round(300, 100), _rollout_round(200, 100), _rollout_round(360, 120)])
    assert [r["mode"] for r in rows] == ["session", "prefix", "re-prefill"]  # docs cite rows.N by position
    s = rows[0]
    assert s["speedup_range"]["min"] == 2.0 and s["speedup_range"]["max"] == 3.0
    assert s["speedup_vs_reprefill"] == 3.0  # the per-round ratio's median, above 1: sessions faster
    assert s["tok_s"] == 300 and s["prefilled"] == 50 and len(s["rounds"]) == 3
    assert rows[2]["speedup_vs_reprefill"] == 1.0


def _range(m: float, lo: float, hi: float) -> dict:
    return {"median": m, "min": lo, "max": hi}


SERVE_OLD = {
    "config": {},
    "decode": [{"context": 1024}, {"context": 32768}],
    "decode_ratio_last_first": {"hybrid": 1.13, "pure_mla": 1.83, "peer": 3.87},
    "prefix_reuse": {"off": {"ttft_s": 0.39}, "on": {"ttft_s": 0.027}},
    "throughput_ratio_32_vs_1": 15.5,
}
SERVE_NEW = {
    **SERVE_OLD,
    "n_rounds": 3,
    "decode_ratio_range": {
        "hybrid": _range(1.13, 1.05, 1.2),
        "pure_mla": _range(1.83, 1.7, 1.9),
        "peer": _range(3.87, 3.5, 4.0),
    },
    "prefix_reuse": {
        "off": {"ttft_s": 0.39},
        "on": {"ttft_s": 0.027},
        "ttft_speedup": _range(14.0, 12.0, 15.0),
    },
    "throughput_ratio_range": _range(15.5, 14.1, 16.2),
}


def test_serve_headlines_carry_the_range_over_rounds_once_the_file_has_rounds():
    hs = serve(SERVE_NEW)
    assert all(h.noise_kind == "range" and "(3 alternating rounds)" in h.noise for h in hs)
    assert "[1.05, 1.20]" in hs[0].noise and "[14.10, 16.20]" in hs[2].noise
    assert "(14.0×)" in hs[1].baseline  # the per-round speed-up's median, not the ratio of medians
    assert all(violations(h) == [] for h in hs)


def test_old_serve_files_still_render_as_one_sample():
    hs = serve(SERVE_OLD)
    assert all(h.noise_kind == "" and "one sample" in h.noise for h in hs)
    assert hs[0].value == "1.13× (hybrid)" and "(14.4×)" in hs[1].baseline


def test_chat_turn_headline_range_and_old_file():
    old = {"config": {}, "turns": {"on": [1.0, 1.33], "off": [1.0, 8.0]}, "last_over_first": 1.33}
    [h, _] = serve_prefix(old)
    assert h.noise_kind == "" and "no rounds recorded" in h.noise and "no reuse 8.00×" in h.baseline
    new = {
        **old,
        "n_rounds": 3,
        "last_over_first_range": _range(1.33, 1.2, 1.4),
        "off_last_over_first_range": _range(7.5, 7, 8),
    }
    [h, _] = serve_prefix(new)
    assert h.noise_kind == "range" and "[1.20, 1.40] (3 alternating rounds)" in h.noise
    assert "no reuse 7.50×" in h.baseline


def test_rollout_headline_prints_each_episode_counts_range_over_rounds():
    rows = [{"mode": m, "episodes": n, "speedup_vs_reprefill": x, "speedup_range": _range(x, x - 0.2, x + .1)}
            for n, x in ((1, 1.7), (32, 0.89)) for m in ("session", "re-prefill")]  # fmt: skip
    [h] = rollout({"rows": rows, "n_rounds": 3})
    assert (
        "32: 0.89× [0.69, 0.99]" in h.value and h.noise_kind == "range" and "3 alternating rounds" in h.noise
    )
    assert "slower at 32 episodes" in h.baseline


def test_load_headline_range_and_old_file():
    old = {"clients": 32, "wall_s": 2.0, "solo_sequential_s": 20.0, "speedup_vs_sequential": 10.0,
           "errors": [], "mismatches": []}  # fmt: skip
    [h] = load(old)
    assert h.noise_kind == "" and "one sample" in h.noise and "0 errors" in h.noise
    [h] = load({**old, "n_rounds": 3, "speedup_range": _range(10.0, 9.0, 11.0), "errors": ["HTTP 500"]})
    assert (
        h.noise_kind == "range"
        and "[9.00, 11.00] (3 alternating rounds)" in h.noise
        and "1 errors" in h.noise
    )
