"""The extraction F1 interval (longmoe.eval.extract.intervals): never degenerate at 0 or 1 when every
page agrees, exact Clopper-Pearson values, a bootstrap that brackets the pooled F1, and the summary
and its table carrying it."""

from __future__ import annotations

import pytest

from longmoe.eval.extract.harness import markdown_summary, summarize
from longmoe.eval.extract.intervals import bootstrap_f1, clopper_pearson, f1_interval


def _row(tp: int, n_pred: int, n_gold: int, family: str = "f") -> dict:
    p, r = tp / max(1, n_pred), tp / max(1, n_gold)
    return {"family": family, "tp": tp, "n_pred": n_pred, "n_gold": n_gold, "valid": 1.0,
            "exact": float(tp == n_gold == n_pred), "precision": p, "recall": r,
            "f1": 2 * p * r / (p + r) if p + r else 0.0}  # fmt: skip


def test_clopper_pearson_known_values():
    assert clopper_pearson(5, 10) == pytest.approx((0.18709, 0.81291), abs=1e-4)
    assert clopper_pearson(200, 200)[0] == pytest.approx(0.025 ** (1 / 200), abs=1e-9)  # rule of three
    assert clopper_pearson(0, 50)[1] == pytest.approx(1 - 0.025 ** (1 / 50), abs=1e-9)
    with pytest.raises(ValueError, match="k=3, n=2"):
        clopper_pearson(3, 2)


def test_all_correct_pages_give_a_lower_bound_below_one():
    iv = f1_interval([_row(3, 3, 3) for _ in range(200)])
    assert iv["micro_f1_hi"] == 1.0 and 0.97 < iv["micro_f1_lo"] < 1.0
    assert iv["micro_f1_interval"] == "bootstrap+clopper-pearson"


def test_all_wrong_pages_give_an_upper_bound_above_zero():
    iv = f1_interval([_row(0, 3, 3) for _ in range(50)])
    assert iv["micro_f1_lo"] == 0.0 and 0.0 < iv["micro_f1_hi"] < 0.1


def test_mixed_pages_use_the_bootstrap_around_the_pooled_f1():
    rows = [_row(2, 3, 3) for _ in range(40)] + [_row(3, 3, 3) for _ in range(40)]
    lo, hi = bootstrap_f1(rows)
    assert lo < 0.8333 < hi and hi - lo < 0.2
    assert bootstrap_f1(rows) == (lo, hi)  # seeded: reproducible
    iv = f1_interval(rows)
    assert iv["micro_f1_interval"] == "bootstrap" and (iv["micro_f1_lo"], iv["micro_f1_hi"]) == (lo, hi)


def test_summary_table_shows_the_interval():
    s = summarize([_row(3, 3, 3, "a") for _ in range(20)])
    c = s["families"]["a"]
    assert c["micro_f1"] == 1.0 and c["micro_f1_lo"] < 1.0
    assert f"1.000 [{c['micro_f1_lo']:.3f}, 1.000]" in markdown_summary(s)
