"""No result number in docs/*.md disagrees with its source (``bench/docnumbers.py``): a citation must
resolve and match at the printed precision, and a number neither in a script-written block nor cited must
be one of the pre-rule numbers listed in ``bench/docnumbers_uncited.json`` (a new or edited one fails)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench import docnumbers

REPO_DOCS = docnumbers.all_found()


def test_every_citation_in_docs_resolves_and_matches_its_source():
    bad = [e for f in REPO_DOCS if f.cite is not None and (e := docnumbers.check_citation(f))]
    assert not bad, "\n".join(bad)


def test_no_uncited_result_number_beyond_the_pre_rule_list():
    allowed = Counter(json.loads(docnumbers.UNCITED.read_text()))
    extra = docnumbers.uncited_keys(REPO_DOCS) - allowed
    assert not extra, (
        "result numbers in docs/ with no citation (add `<!-- from: PATH#KEY -->` after each, or write it "
        "from a script between markers):\n" + "\n".join(extra)
    )


def _doc(tmp_path, result: dict, text: str) -> list[docnumbers.Found]:
    (tmp_path / "r.json").write_text(json.dumps(result))
    return docnumbers.scan(text, "x.md")


def test_a_cited_number_matches_at_its_printed_precision_and_a_changed_one_fails(tmp_path):
    res = {"a": {"b": [0.0, 2.254]}, "s": 0.0123, "share": 0.416}
    text = (
        "speed-up 2.25× <!-- from: r.json#a.b.1 --> and 12.3 ms <!-- from: r.json#s*1000 --> "
        "at 42% <!-- from: r.json#share -->\n"
    )
    found = _doc(tmp_path, res, text)
    assert [f.text for f in found] == ["2.25×", "12.3 ms", "42%"]
    assert all(docnumbers.check_citation(f, tmp_path) is None for f in found)
    [wrong] = _doc(tmp_path, res, "speed-up 2.4× <!-- from: r.json#a.b.1 -->\n")
    assert "holds 2.254" in docnumbers.check_citation(wrong, tmp_path)


@pytest.mark.parametrize(
    ("cite", "says"),
    [("nope.json#a", "no such file"), ("r.json#a.z", "no 'z' there"), ("r.json#a", "not a number")],
)
def test_a_citation_that_does_not_resolve_says_why(tmp_path, cite, says):
    [f] = _doc(tmp_path, {"a": {"b": 1}}, f"took 3.0 s <!-- from: {cite} -->\n")
    assert says in docnumbers.check_citation(f, tmp_path)


def test_blocks_code_targets_and_sizes_are_exempt_and_a_bare_result_is_not(tmp_path):
    text = "\n".join(
        [
            "<!-- bench:x:start -->",
            "| 9.9 ms |",
            "<!-- bench:x:end -->",
            "```",
            "took 5 s",
            "```",
            "run `sleep 3 s` with target ≤ 1.5× and a 1 GiB tensor, at least 8×",
            "decode got 1.86× faster",
        ]
    )
    found = _doc(tmp_path, {}, text)
    assert [(f.line, f.text, f.cite) for f in found] == [(8, "1.86×", None)]


def test_a_citation_covers_only_the_number_before_it(tmp_path):
    found = _doc(tmp_path, {"v": 2.0}, "2.0× <!-- from: r.json#v --> then 3.0×\n")
    assert [f.cite is not None for f in found] == [True, False]
