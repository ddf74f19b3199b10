"""Scoring functions on hand-written cases."""

from __future__ import annotations

import pytest

from longmoe.eval.scoring import answer_span, contains_all, contains_part, exact_match, normalize, score


def test_normalize():
    assert normalize("  The Answer: 1,234!  ") == "answer 1 234"
    assert normalize("crimson-otter.") == "crimson-otter"
    assert normalize("- 42 -") == "42"


@pytest.mark.parametrize(
    ("pred", "answers", "exact", "all_", "part"),
    [
        (" 4821937", ["4821937"], 1.0, 1.0, 1.0),
        ("4821937.\nQuestion: something else 111", ["4821937"], 1.0, 1.0, 1.0),
        ("The number is 4821937", ["4821937"], 0.0, 1.0, 1.0),
        ("48219370", ["4821937"], 0.0, 0.0, 0.0),  # a longer number does not contain it
        ("12", ["2"], 0.0, 0.0, 0.0),
        ("", ["2"], 0.0, 0.0, 0.0),
        ("111, 222 and 333", ["333", "111", "222"], 1.0, 1.0, 1.0),  # order-free set
        ("111, 222", ["111", "222", "333"], 0.0, 0.0, 2 / 3),
        ("111, 222, 333, 444", ["111", "222", "333"], 0.0, 1.0, 1.0),  # extra item: not exact
        ("Crimson-Otter", ["crimson-otter"], 1.0, 1.0, 1.0),
        ("crimson", ["crimson-otter"], 0.0, 0.0, 0.0),
        ("crimson-otters", ["crimson-otter"], 0.0, 0.0, 0.0),
        ("ABCDE, FGHIJ", ["abcde", "fghij"], 1.0, 1.0, 1.0),
        ("\n\n  7\n", ["7"], 1.0, 1.0, 1.0),
        ("nothing", [], 0.0, 0.0, 0.0),
    ],
)
def test_metrics(pred, answers, exact, all_, part):
    assert exact_match(pred, answers) == exact
    assert contains_all(pred, answers) == all_
    assert contains_part(pred, answers) == pytest.approx(part)
    assert score(pred, answers) == pytest.approx({"exact": exact, "all": all_, "part": part})


def test_only_first_line_is_scored():
    assert answer_span("\n  first \nsecond") == "first"
    assert contains_all("wrong\n4821937", ["4821937"]) == 0.0
