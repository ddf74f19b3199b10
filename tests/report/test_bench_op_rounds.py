"""The operator benchmarks (bench/kda.py, bench/moe.py, bench/packed_attention.py) over alternating rounds:
each number the median over rounds under the key docs cite, each ratio oriented so that above 1 means
longmoe is faster, with its per-round median and [min, max]; the report card reads the range from a file
with rounds and keeps the one-sample text for a file written before (issue 50)."""

from __future__ import annotations

import pytest

from bench import kda, moe, packed_attention
from bench.common import over_rounds
from longmoe.report.headlines import _kda, _moe, _packed_attention

# -- the shared helper -------------------------------------------------------------------------------


def test_over_rounds_keeps_each_key_as_the_median_and_each_ratio_as_median_and_range():
    per = [
        {"T": 1024, "impl": "longmoe", "s": {"a": 1.0, "b": 9.0}, "x": 2.0},
        {"T": 1024, "impl": "longmoe", "s": {"a": 3.0, "b": 5.0}, "x": 4.0},
    ]
    row = over_rounds(per, timed=("s",), ratios={"x": "x_range", "s": "s_range"})
    assert row["T"] == 1024 and isinstance(row["T"], int), "a setting equal in every round keeps its type"
    assert row["impl"] == "longmoe"
    assert row["s"] == {"a": 2.0, "b": 7.0} and row["x"] == 3.0
    assert row["x_range"] == {"median": 3.0, "min": 2.0, "max": 4.0}
    assert row["s_range"]["b"] == {"median": 7.0, "min": 5.0, "max": 9.0}
    assert row["rounds"] == [{"s": p["s"]} for p in per]


def test_over_rounds_of_one_round_is_that_round_with_a_zero_width_range():
    row = over_rounds([{"r": 1.5}], timed=(), ratios={"r": "r"})
    assert row == {"r": {"median": 1.5, "min": 1.5, "max": 1.5}}, "no timed keys: no rounds list"


# -- ratio orientation ---------------------------------------------------------------------------------


def test_kda_speedup_is_the_peer_time_over_longmoes_so_above_one_means_longmoe_faster():
    assert kda.speedups({"longmoe": 0.01, "transformers chunk64": 0.2}) == {"transformers chunk64": 20.0}


def test_moe_ratios_are_grouped_mm_over_longmoe_and_longmoe_over_its_e8_time():
    def row(E, impl, fwd, fb):
        return [E, "float32", 1, impl, fwd, 0.5, fb, 0.5, 0.0, 100.0]

    rows = [row(8, "longmoe", 1.0, 2.0), row(8, "transformers grouped_mm", 2.0, 3.0)]
    rows += [row(64, "longmoe", 1.5, 5.0), row(64, "transformers eager", "error: X", "")[:5] + [""] * 5]
    r8, r64 = moe.round_ratios(rows)
    assert r8[moe.VS_PEER] == {"fwd s": 2.0, "fwd+bwd s": 1.5}
    assert moe.VS_PEER not in r64, "no grouped_mm row at E = 64: no speed-up"
    assert r64[moe.VS_E8] == {"fwd s": 1.5, "fwd+bwd s": 2.5}


def test_packed_attention_speedup_is_the_full_mask_time_over_the_rows():
    case = dict(T=4096, window=512, docs="50-460", dtype="float32")
    rows = [{**case, "impl": "longmoe", "fwdbwd_s": 0.1}, {**case, "impl": "full mask", "fwdbwd_s": 1.0}]
    sp = [r[packed_attention.SPEEDUP] for r in packed_attention.with_speedups(rows)]
    assert sp == [10.0, 1.0]


# -- median and range over rounds, per script ------------------------------------------------------------


def _kda_round(t_ours: float, t_peer: float) -> list[dict]:
    fwd = {
        "longmoe": t_ours,
        "transformers chunk64": t_peer,
        "longmoe sub-chunk (unbounded gate)": 2 * t_ours,
    }
    fb = {"longmoe": 3 * t_ours, "longmoe sub-chunk (unbounded gate)": 6 * t_ours}
    entry = {"T": 4096, "dtype": "float32", "fwd_s": fwd, "fwd_bwd_s": fb}
    entry |= {"roofline_share_fwd": 0.1, "roofline_share_fwd_bwd": 0.1}
    return [entry | {"speedup_fwd": kda.speedups(fwd), "speedup_fwd_bwd": kda.speedups(fb)}]


def test_kda_file_keeps_the_cited_keys_as_medians_and_the_per_round_speedup_range():
    (row,) = kda.combine([_kda_round(1.0, 10.0), _kda_round(1.0, 14.0), _kda_round(2.0, 16.0)])
    assert row["fwd_s"]["longmoe"] == 1.0 and row["fwd_s"]["transformers chunk64"] == 14.0
    assert row["speedup_fwd"]["transformers chunk64"] == 10.0, "the per-round ratio's median (8, 10, 14)"
    assert row["speedup_fwd_range"]["transformers chunk64"] == {"median": 10.0, "min": 8.0, "max": 14.0}
    assert len(row["rounds"]) == 3
    md = kda.render([row], ["transformers chunk64"], [kda.SUBCHUNK], {"float32": 1e11}, 3)
    assert "10.0× [8.0, 14.0]" in md, "tables show a ratio as median [min, max]"


def test_moe_file_keeps_row_positions_and_keys_and_the_ratio_range():
    def rnd(ours_fb: float, peer_fb: float) -> list[list]:
        return [
            [8, "float32", 1, "longmoe", 1.0, 0.5, ours_fb, 0.5, 0.0, 100.0],
            [8, "float32", 1, "transformers eager", "error: RuntimeError", "", "", "", "", ""],
            [8, "float32", 1, "transformers grouped_mm", 1.0, 0.5, peer_fb, 0.5, 0.0, 100.0],
        ]

    table, ratios = moe.combine([rnd(1.0, 2.0), rnd(2.0, 3.0), rnd(1.0, 1.2)])
    assert [r[3] for r in table] == ["longmoe", "transformers eager", "transformers grouped_mm"]
    assert table[0][6] == 1.0 and table[2][6] == 2.0, "fwd+bwd s: each arm's median over rounds"
    assert isinstance(table[1][4], str), "an error row stays an error row"
    (r,) = ratios
    assert r[moe.VS_PEER]["fwd+bwd s"] == {"median": 1.5, "min": 1.2, "max": 2.0}


def test_packed_attention_file_keeps_the_cited_times_as_medians_and_the_speedup_range():
    case = dict(T=4096, window=512, docs="50-460", n_docs=22, dtype="float32")

    def rnd(ours: float) -> list[dict]:
        rows = [{**case, "impl": "longmoe", "fwdbwd_s": ours}, {**case, "impl": "full mask", "fwdbwd_s": 1.0}]
        rows = [{**r, "fwd_s": r["fwdbwd_s"] / 4, "fwdbwd_gflops": 1.0, "max_rel_err": 0.0} for r in rows]
        return packed_attention.with_speedups(rows)

    rows = packed_attention.combine([rnd(0.1), rnd(0.2), rnd(0.125)])
    assert rows[0]["fwdbwd_s"] == 0.125 and rows[1]["fwdbwd_s"] == 1.0
    assert rows[0][packed_attention.SPEEDUP + "_range"] == {"median": 8.0, "min": 5.0, "max": 10.0}
    assert "8.00 [5.00, 10.00]" in packed_attention.render(rows, 2, 32, 3)


# -- headlines: a range from a file with rounds, the one-sample text from an old file ---------------------


def _moe_file(rounds: bool) -> dict:
    rows = [
        {"E": 896, "dtype": "float32", "α": 1, "impl": "longmoe", "fwd+bwd s": 0.5, "fwd+bwd/roof": 0.4},
        {"E": 896, "dtype": "float32", "α": 1, "impl": "transformers grouped_mm", "fwd+bwd s": 1.0},
    ]
    if not rounds:
        return {"rows": rows}
    s = {"median": 1.8, "min": 1.6, "max": 2.1}
    vs = {"E": 896, "dtype": "float32", "α": 1, moe.VS_PEER: {"fwd s": s, "fwd+bwd s": s}}
    return {"n_rounds": 3, "rows": rows, "ratios": [vs]}


def _packed_file(rounds: bool) -> dict:
    row = dict(T=16384, window=2048, docs="200-1800", n_docs=13, dtype="float32")
    ours = {**row, "impl": "longmoe", "fwdbwd_s": 0.1}
    full = {**row, "impl": "full mask", "fwdbwd_s": 1.0}
    if not rounds:
        return {"rows": [ours, full]}
    ours[packed_attention.SPEEDUP + "_range"] = {"median": 9.0, "min": 8.5, "max": 11.0}
    return {"n_rounds": 3, "rows": [ours, full]}


def _kda_file(rounds: bool) -> dict:
    if not rounds:
        return {"results": _kda_round(1.0, 20.0)}
    return {
        "n_rounds": 3,
        "results": kda.combine([_kda_round(1.0, 10.0), _kda_round(1.0, 14.0), _kda_round(1.0, 12.0)]),
    }


CASES = [(_kda, _kda_file, "[10.00, 14.00]"), (_moe, _moe_file, "[1.60, 2.10]"),
         (_packed_attention, _packed_file, "[8.50, 11.00]")]  # fmt: skip


@pytest.mark.parametrize("section, make, bounds", CASES, ids=["kda", "moe", "packed_attention"])
def test_a_file_with_rounds_gives_the_per_round_range_and_its_count(section, make, bounds):
    h = section(make(True))[0]
    assert h.noise_kind == "range" and bounds in h.noise and "3 alternating rounds" in h.noise
    assert "one sample" not in h.noise


@pytest.mark.parametrize("section, make, bounds", CASES, ids=["kda", "moe", "packed_attention"])
def test_an_old_file_without_rounds_still_renders_as_one_sample(section, make, bounds):
    for h in section(make(False)):
        assert h.noise_kind == "" and "one sample" in h.noise and bounds not in h.noise


def test_a_headline_ratio_from_rounds_is_the_per_round_median_not_the_ratio_of_medians():
    assert "(1.80×)" in _moe(_moe_file(True))[0].baseline  # the times alone would give 2.00×
    assert "(9.00×)" in _packed_attention(_packed_file(True))[0].baseline  # times alone: 10×
    assert "(2.00×)" in _moe(_moe_file(False))[0].baseline
