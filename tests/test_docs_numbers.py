"""No result number in docs/*.md disagrees with its source (``bench/docnumbers.py``): a citation must
resolve and match at the printed precision, and a number neither in a script-written block nor cited must
be one of the pre-rule numbers listed in ``bench/docnumbers_uncited.json`` (a new or edited one fails)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench import docnumbers, tables

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


def test_a_quoted_key_part_may_hold_dots_spaces_and_slashes(tmp_path):
    res = {"rows": [{"fwd+bwd s": 0.706, "tok/s": 12.5, "v1.2": 3.0}]}
    text = (
        'took 706 ms <!-- from: r.json#rows.0."fwd+bwd s"*1000 --> '
        'at 12.5 tok/s <!-- from: r.json#rows.0."tok/s" --> and 3.0× <!-- from: r.json#rows.0."v1.2" -->\n'
    )
    found = _doc(tmp_path, res, text)
    assert [f.cite["key"] for f in found] == ['rows.0."fwd+bwd s"', 'rows.0."tok/s"', 'rows.0."v1.2"']
    assert all(docnumbers.check_citation(f, tmp_path) is None for f in found)
    [unquoted] = _doc(tmp_path, res, "took 0.7 s <!-- from: r.json#rows.0.fwd+bwd s -->\n")
    assert unquoted.cite is None  # a space ends an unquoted key: the citation is not recognised


def test_a_ratio_citation_divides_two_values_of_one_file(tmp_path):
    res = {"eager": 58.7, "compiled": 26.8, "zero": 0}
    [ok] = _doc(tmp_path, res, "compiled is 2.19× faster <!-- from: r.json#eager / compiled -->\n")
    assert docnumbers.check_citation(ok, tmp_path) is None
    [stale] = _doc(tmp_path, res, "compiled is 2.25× faster <!-- from: r.json#eager / compiled -->\n")
    assert "#eager / compiled holds 2.19" in docnumbers.check_citation(stale, tmp_path)
    [by_zero] = _doc(tmp_path, res, "compiled is 2.25× faster <!-- from: r.json#eager / zero -->\n")
    assert docnumbers.check_citation(by_zero, tmp_path) is not None


@pytest.mark.parametrize(
    "text",
    [
        "runs two 3×3 convolutions",  # a shape
        "images of 64 × 64 patches",
        "dp_shard = 2 × ep = 2",  # a product of settings
        "evaluates at 1x, 2x, 4x and 8x the window",  # multiples of a setting
        "at 10× the learning rate",
        "| 1x (512) | 2x (1024) |",
        "tested within ±2%",  # a tolerance
        "fail_timeout=10s",  # a key=value setting
        "p95 TTFT above the 2 s SLO",
        "generated tokens/s over the last 10 s",
        "a 1M window needs cp = 64 to fit 80 GiB",  # a capacity
        "on 141 GiB devices",
        "glibc serves every block above 32 MB with mmap",  # a threshold
        "short of the 25% target",
        "bf16, 100 MB shards",
        "field F1 with its 95% interval, [95% CI], not confirmed at 95% confidence",  # confidence levels
        "the difference against a margin of 0.05 nats",
        "`--body-timeout` (default 30 s) bounds it",
    ],
)
def test_shapes_setting_multiples_tolerances_and_settings_are_exempt(tmp_path, text):
    assert _doc(tmp_path, {}, text + "\n") == []


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("compiled decode is 2.25× eager", "2.25×"),  # a ratio: no operand after the sign
        ("the 64K rise was 10× slower", "10×"),  # 'slower' is not an SLO
        ("1.5 × faster than the peer", "1.5 ×"),
        ("4× fewer tokens than the window holds", "4×"),  # a result next to a setting word
    ],
)
def test_ratios_near_the_exempt_forms_still_count(tmp_path, text, printed):
    assert [f.text for f in _doc(tmp_path, {}, text + "\n")] == [printed]


def test_a_script_written_block_is_exempt_only_where_bench_tables_checks_it():
    marked = {p.name for p in docnumbers.DOCS.glob("*.md") if docnumbers.BLOCK_START.search(p.read_text())}
    checked = {d.removeprefix("docs/") for d in tables.DOCS} | docnumbers.GENERATED
    assert marked <= checked, f"blocks no script rewrites (list in bench/tables.DOCS): {marked - checked}"


def test_a_markdown_report_is_cited_by_the_number_after_a_unique_anchor(tmp_path):
    (tmp_path / "rep.md").write_text(
        "quantile − none -0.0058 ± 0.0066, sign − none -0.0073 ± 0.0063 over 5 seeds\n"
    )
    [ok] = _doc(tmp_path, {}, 'sign costs 0.0063 nats <!-- from: rep.md#"sign − none -0.0073 ±" -->\n')
    assert docnumbers.check_citation(ok, tmp_path) is None
    [neg] = _doc(tmp_path, {}, 'a −0.0058 nats gap <!-- from: rep.md#"quantile − none" -->\n')
    assert neg.text == "0.0058 nats" and "holds -0.0058" in docnumbers.check_citation(neg, tmp_path)
    [twice] = _doc(tmp_path, {}, 'took 0.0063 nats <!-- from: rep.md#"none" -->\n')
    assert "occurs 2 times" in docnumbers.check_citation(twice, tmp_path)
    [dotted] = _doc(tmp_path, {}, "took 0.0063 nats <!-- from: rep.md#a.b -->\n")
    assert "one quoted anchor" in docnumbers.check_citation(dotted, tmp_path)


def test_refresh_reprints_only_stale_cited_numbers_at_their_precision_and_lists_each(tmp_path):
    res = {"a": 2.254, "b": 1234.6, "c": 0.5, "s": 0.0311}
    text = (
        "was 1.90× <!-- from: r.json#a --> at 1,100 tok/s <!-- from: r.json#b --> and 0.5 s "
        "<!-- from: r.json#c --> (31.1 ms <!-- from: r.json#s*1000 -->)\n"
        "a bare 7.0 ms stays, `9.9 ms` in code stays, 3.0 s <!-- from: nope.json#x --> stays\n"
    )
    (tmp_path / "r.json").write_text(json.dumps(res))
    new, changes = docnumbers.refresh(text, "x.md", tmp_path)
    assert new.splitlines()[0] == (
        "was 2.25× <!-- from: r.json#a --> at 1,235 tok/s <!-- from: r.json#b --> and 0.5 s "
        "<!-- from: r.json#c --> (31.1 ms <!-- from: r.json#s*1000 -->)"
    )
    assert new.splitlines()[1] == text.splitlines()[1]
    assert changes == ["x.md:1: 1.90 -> 2.25 | was ...", "x.md:1: 1,100 -> 1,235 | was 1.90× at ..."]
    first_line = [f for f in docnumbers.scan(new, "x.md") if f.line == 1]
    assert len(first_line) == 4 and all(docnumbers.check_citation(f, tmp_path) is None for f in first_line)


def test_a_citation_checks_the_number_before_it_with_or_without_a_unit(tmp_path):
    """A range's low end ("4.07 <!-- -->-4.92×"), a number sharing a later unit ("7.4 and 10.2 GB/s") and
    an exponent form ("7.6e-06 nats") are checked by the citation after them, and refreshed like any other."""
    res = {"lo": 4.07, "hi": 4.92, "a": 5.8, "kl": 7.6e-06}
    text = (
        "ratios 4.07 <!-- from: r.json#lo -->-4.92× <!-- from: r.json#hi -->, reads 7.4 "
        "<!-- from: r.json#a --> and 10.2 GB/s, KL 1.53e-05 <!-- from: r.json#kl --> nats\n"
    )
    found = _doc(tmp_path, res, text)
    assert [f.text for f in found] == ["4.07", "4.92×", "7.4", "10.2 GB", "1.53e-05"]
    cited = [f for f in found if f.cite is not None]
    assert [docnumbers.check_citation(f, tmp_path) is None for f in cited] == [True, True, False, False]
    new, changes = docnumbers.refresh(text, "x.md", tmp_path)
    assert "reads 5.8 <!--" in new and "KL 7.60e-06 <!--" in new and len(changes) == 2
    assert all(docnumbers.check_citation(f, tmp_path) is None for f in docnumbers.scan(new, "x.md") if f.cite)


def test_a_range_over_rows_cites_its_ends_and_follows_the_file_when_they_move(tmp_path):
    res = {"results": [{"s": {"a": 1.9}}, {"s": {"a": 2.5}}, {"s": {}}, {"s": {"a": 2.1}}]}
    text = (
        "1.9 <!-- from: r.json#min:results.[].s.a -->–2.5× <!-- from: r.json#max:results.[].s.a --> faster\n"
    )
    found = _doc(tmp_path, res, text)
    assert [f.text for f in found] == ["1.9", "2.5×"]
    assert all(docnumbers.check_citation(f, tmp_path) is None for f in found)
    res["results"][2]["s"]["a"] = 3.0  # a rerun moves the top end to another row
    (tmp_path / "r.json").write_text(json.dumps(res))
    new, changes = docnumbers.refresh(text, "x.md", tmp_path)
    assert "–3.0× <!--" in new and len(changes) == 1
    [bad] = _doc(tmp_path, res, "2.0× <!-- from: r.json#max:results.[].s.zz -->\n")
    assert "no number at any row" in docnumbers.check_citation(bad, tmp_path)
    [plain] = _doc(tmp_path, res, "2.0× <!-- from: r.json#results.[].s.a -->\n")  # [] only with min:/max:
    assert "no '[]' there" in docnumbers.check_citation(plain, tmp_path)


def test_a_citation_that_covers_no_number_fails():
    """'[3.34, 3.73] <!-- from -->': the bracket stops the citation reaching 3.73: it would check nothing."""
    found = docnumbers.scan("range [3.34, 3.73] <!-- from: r.json#a --> per round\n", "x.md")
    [orphan] = [f for f in found if f.cite is not None]
    assert "covers no number" in docnumbers.check_citation(orphan)
