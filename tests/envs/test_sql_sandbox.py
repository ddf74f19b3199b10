"""The read-only SQL sandbox, attacked: nothing but SELECT over the task's tables runs, every
query ends within its budget, results are capped and the caps are stated."""

from __future__ import annotations

import os
import resource
import sqlite3
import time

import pytest

from longmoe.envs.sql_sandbox import STEP_OPS, Sandbox, SandboxLimits, SQLError, truncate

TABLES = {
    "t": "a,b\n" + "\n".join(f"{i},x{i}" for i in range(60)),
    "u": "k,v\n1,one\n2,\n",
}


@pytest.fixture
def box() -> Sandbox:
    return Sandbox(TABLES, SandboxLimits(max_rows=20, max_chars=400, max_steps=2000, max_seconds=5.0))


def test_reads_work_and_types_come_from_the_csv(box: Sandbox) -> None:
    assert box.describe() == "t(a INTEGER, b TEXT)\nu(k INTEGER, v TEXT)"
    assert box.query("SELECT SUM(a) AS s FROM t WHERE a < 4") == "s\n6"
    assert box.query("SELECT v FROM u WHERE k = 2") == "v\nNULL"  # an empty CSV field is NULL
    assert box.query("SELECT a FROM t WHERE a > 1000") == "a\n(no rows)"
    assert box.query("SELECT count(*) FROM t a JOIN u b ON a.a = b.k") == "count(*)\n2"


@pytest.mark.parametrize(
    "sql",
    [
        "ATTACH DATABASE '/tmp/longmoe_attack.db' AS x",
        "ATTACH DATABASE ':memory:' AS x",
        "SELECT load_extension('/tmp/evil')",
        "PRAGMA table_info(t)",
        "PRAGMA query_only = 0",
        "PRAGMA writable_schema = 1",
        "SELECT * FROM pragma_table_info('t')",
        "INSERT INTO t VALUES (1, 'y')",
        "UPDATE t SET a = 0",
        "DELETE FROM t",
        "DROP TABLE t",
        "CREATE TABLE z(x)",
        "CREATE TEMP TABLE z(x)",
        "CREATE VIEW w AS SELECT 1",
        "BEGIN",
        "VACUUM",
        "VACUUM INTO '/tmp/longmoe_attack.db'",
        "SELECT name FROM sqlite_master",
        "SELECT sql FROM sqlite_schema",
        "SELECT printf('%.*c', 100000000, 'x')",
        "SELECT zeroblob(1000000000)",
        "SELECT randomblob(1000000000)",
        "SELECT replace(b, 'x', b) FROM t",
        "SELECT random()",
        "SELECT sqlite_version()",
        "SELECT readfile('/etc/passwd')",
    ],
)
def test_everything_but_reads_is_refused(box: Sandbox, sql: str) -> None:
    with pytest.raises(SQLError):
        box.query(sql)
    assert not os.path.exists("/tmp/longmoe_attack.db")
    assert box.query("SELECT count(*) FROM t") == "count(*)\n60"  # nothing changed


def test_refusals_name_the_rule(box: Sandbox) -> None:
    with pytest.raises(
        SQLError, match=r"not authorized: only SELECT over the tables \['t', 'u'\].*load_extension"
    ):
        box.query("SELECT load_extension('x')")


@pytest.mark.parametrize(
    "sql",
    [
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
        "SELECT count(*) FROM t a, t b, t c, t d, t e, t f",
        "SELECT a.b FROM t a, t b, t c, t d ORDER BY a.b || b.b || c.b || d.b DESC LIMIT 1",
        "WITH RECURSIVE c(x) AS (SELECT 'a' UNION ALL SELECT x || x FROM c) SELECT max(length(x)) FROM c",
    ],
)
def test_runaway_queries_stop_within_the_budget(box: Sandbox, sql: str) -> None:
    """Deterministic budget: 2000 callbacks x STEP_OPS instructions (or a too-big string), well
    under a second here, and memory stays bounded."""
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(SQLError, match="budget|too big"):
        box.query(sql)
    assert time.perf_counter() - t0 < 5.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 512 * 1024  # KiB: < 512 MiB
    assert box.query("SELECT 1 AS one") == "one\n1"  # the connection still works


def test_the_wall_clock_is_a_backstop() -> None:
    box = Sandbox(TABLES, SandboxLimits(max_steps=10**9, max_seconds=0.2))
    t0 = time.perf_counter()
    with pytest.raises(SQLError, match="budget"):
        box.query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
    assert time.perf_counter() - t0 < 3.0
    assert STEP_OPS > 0


def test_infinite_recursion_with_a_row_cap_returns_the_capped_rows(box: Sandbox) -> None:
    out = box.query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c")
    lines = out.split("\n")
    assert lines[1:21] == [str(i) for i in range(1, 21)]
    assert lines[-1] == "[only the first 20 rows are shown]"


def test_results_are_cut_to_the_stated_size(box: Sandbox) -> None:
    out = Sandbox(TABLES, SandboxLimits(max_rows=100, max_chars=300)).query("SELECT a, b, b, b FROM t")
    assert len(out) <= 300 and "[truncated: showing" in out and "cut at 300]" in out
    assert truncate("abc", 0) == "abc" and truncate("abc", 10) == "abc"
    cut = truncate("x" * 1000, 200)
    assert len(cut) <= 200 and cut.startswith("x") and "of 1000 characters" in cut


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("SELECT 1 AS " + "x" * 5000, "characters: at most"),
        ("SELECT 1\x00; DROP TABLE t", "NUL"),
        ("SELECT '\ud800'", "UTF-8"),
        ("SELECT 1; SELECT 2", "one statement"),
        ("SELEC 1", "syntax error"),
        ("SELECT * FROM nope", "no such table"),
        ("SELECT * FROM main.sqlite_temp_master", "prohibited|not authorized|no such table"),
        ("SELECT " + "(" * 200 + "1" + ")" * 200, "depth|too|overflow"),
        ("SELECT " + "- " * 1500 + "1", "depth|too|overflow"),
    ],
)
def test_bad_queries_get_one_line_errors(box: Sandbox, sql: str, why: str) -> None:
    with pytest.raises(SQLError, match=why) as e:
        box.query(sql)
    assert "\n" not in str(e.value)


def test_odd_values_render(box: Sandbox) -> None:
    out = box.query("SELECT CAST(x'ff' AS TEXT) AS bad, x'00ff' AS blob, 1.5 AS f, NULL AS n")
    assert out.split("\n")[1] == "\ufffd,x'00ff',1.5,NULL"


def test_no_extension_loading_is_possible(box: Sandbox) -> None:
    enable = getattr(box.db, "enable_load_extension", None)
    if enable is not None:  # builds with extension support: it is off, and the SQL function refused
        with pytest.raises(SQLError):
            box.query("SELECT load_extension('x')")
    assert box.db.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) == 0
