"""The README's and docs/benchmarks.md's tables, and docs/report.md, are what the scripts write from the
committed result files: a number pasted or edited by hand, or a result file committed without its tables
rewritten, fails here (fix: ``python -m bench.tables`` and ``longmoe report --out docs/report.md``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import tables
from longmoe.errors import UserError
from longmoe.report.card import collect, default_dirs, render

ROOT = Path(__file__).resolve().parents[2]


def test_readme_and_benchmark_tables_match_the_committed_results():
    assert tables.stale(ROOT) == [], "a table differs from its result file: run `python -m bench.tables`"


def test_committed_report_card_matches_the_committed_results():
    expected = render(collect(default_dirs(ROOT)), ROOT)
    assert (ROOT / "docs" / "report.md").read_text() == expected, "run `longmoe report --out docs/report.md`"


def test_every_marked_table_has_a_source():
    srcs = tables.sources(ROOT)
    for doc in tables.DOCS:
        names = [m["name"] for m in tables.BLOCK.finditer((ROOT / doc).read_text())]
        assert names and all(n in srcs for n in names), doc


def test_an_edited_table_is_stale(tmp_path):
    text = (ROOT / "README.md").read_text()
    edited = text.replace("<!-- headline:start -->\n", "<!-- headline:start -->\n| pasted | 1 |\n", 1)
    assert tables.rewrite(edited, tables.sources(ROOT), "README.md") == text


def test_a_table_unknown_to_the_script_is_an_error():
    with pytest.raises(UserError, match="'nope' has no source"):
        tables.rewrite("<!-- nope:start -->\nx\n<!-- nope:end -->\n", {}, "README.md")


def test_a_bench_table_that_does_not_match_its_json_hash_is_an_error(tmp_path):
    res = tmp_path / "bench" / "results"
    res.mkdir(parents=True)
    (res / "x.md").write_text("| a |\n|---|\n| 2 |\n")
    (res / "x.json").write_text(json.dumps({"table_sha256": tables.table_sha256("| a |\n|---|\n| 1 |")}))
    with pytest.raises(UserError, match="x.md: does not match"):
        tables._bench_table("x", tmp_path)


def test_a_new_benchmark_block_is_added_where_new_tables_go():
    text = f"intro\n\n{tables.NEW_TABLES_HERE}\n\n## after\n"
    out = tables.ensure_block(text, "bench:new", "")
    assert out.index("<!-- bench:new:start -->") < out.index(tables.NEW_TABLES_HERE) < out.index("## after")
    assert tables.ensure_block(out, "bench:new", "") == out


def _demo_run(tmp_path: Path, commit: str | None) -> Path:
    src = json.loads((ROOT / "docs" / "results" / "demo_results.json").read_text())
    run = tmp_path / "run"
    run.mkdir(parents=True)
    if commit is not None:
        src["provenance"] = {"commit": commit, "date": "2026-12-07 14:00 UTC", "command": "longmoe demo"}
    else:
        src.pop("provenance", None)
    (run / "report.json").write_text(json.dumps(src))
    (tmp_path / "docs" / "results").mkdir(parents=True)
    return run


def test_make_demo_publishes_the_runs_own_record_and_refuses_a_dirty_one(tmp_path):
    run = _demo_run(tmp_path, "abc1234")
    out = tables.import_demo(run, tmp_path)
    assert json.loads(out.read_text())["provenance"]["commit"] == "abc1234"
    dirty = _demo_run(tmp_path / "d", "abc1234+dirty")
    with pytest.raises(UserError, match="dirty tree"):
        tables.import_demo(dirty, tmp_path / "d")
    assert (
        "+dirty"
        in json.loads(tables.import_demo(dirty, tmp_path / "d", allow_dirty=True).read_text())["provenance"][
            "commit"
        ]
    )


def test_a_new_demo_run_leaves_no_stale_number_in_the_docs():
    """`make demo` rewrites demo_results.json with this run's timings, and `make test` must still pass after
    it: no prose cites that file (a run-dependent number would go stale); its numbers live in blocks the
    script rewrites."""
    from bench import docnumbers

    cited = [f for f in docnumbers.all_found() if f.cite and "demo_results.json" in f.cite["path"]]
    assert cited == [], [f"{f.doc}:{f.line}: {f.text}" for f in cited]


def test_the_demo_run_line_follows_the_result_it_renders():
    from longmoe.pipelines.demo.report import run_summary

    d = json.loads((ROOT / "docs" / "results" / "demo_results.json").read_text())
    d["provenance"] = {**d["provenance"], "wall_s": 12.34, "threads": 2, "commit": "f00ba47"}
    line = run_summary(d)
    assert "**12.3 s** wall" in line and "2 threads" in line and "commit f00ba47" in line
    d.pop("provenance")
    assert "wall time not recorded" in run_summary(d)


def test_make_demo_rewrites_everything_that_reads_the_demo_result():
    """`make demo` replaces demo_results.json; every committed file rendered from it (README and docs tables,
    the report card) must be rewritten in the same target, or `make test` fails after `make demo`."""
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "bench.tables --demo runs/demo" in recipe
    assert "longmoe report --out docs/report.md" in recipe
    assert recipe.index("bench.tables --demo") < recipe.index("longmoe report")  # the card reads the new file
