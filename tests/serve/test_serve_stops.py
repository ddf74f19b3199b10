"""Stop strings: hold-back of a possible stop prefix, and a search bounded to where a new match can be."""

from __future__ import annotations

from longmoe.serve.stops import find_stop, safe_end


def test_stop_helpers_hold_back_and_search_only_the_tail():
    assert safe_end("hello wor", ["world"], 0) == len("hello ")
    assert safe_end("hello wor", ["world", "or"], 0) == len("hello ")
    assert safe_end("abcab", ["abx"], 3) == 3  # the held "ab" starts where the shown text ends
    assert safe_end("abc", [], 0) == 3
    assert find_stop("xxSTOP", ["STOP"], 2) == 2  # a match ending in the new text
    assert find_stop("xxSTOP", ["TO", "OP"], 1) == 4  # only matches ending in the new character
    old = "STOP" + "x" * 1000 + "y"  # a match far back is outside the searched tail
    assert find_stop(old, ["STOP"], 1) is None
