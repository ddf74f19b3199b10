"""A read-only SQL sandbox on SQLite (standard library): the data-analysis environment's only tool.

A task's tables are loaded from CSV text into a private in-memory database; then the connection is
locked down before the agent's first query, in layers, so that one slip is not a hole:

- ``PRAGMA query_only`` (no write can run at all) and, from then on, an **authorizer**
  (``set_authorizer``) that allows only ``SELECT``, reads of the task's own tables, a whitelist of
  pure scalar and aggregate functions, and (recursive) common table expressions; everything else
  (``ATTACH``, ``PRAGMA``, writes, DDL, transactions, ``load_extension``, ``sqlite_master``, ``printf``
  / ``zeroblob`` / ``randomblob``) is refused at prepare time with ``not authorized``;
- ``SQLITE_LIMIT_ATTACHED = 0`` and tight limits on string length, SQL length, expression depth,
  compound selects, columns and function arguments (``Connection.setlimit``); the Python build has no
  extension loading, and none is enabled;
- a **budget** (``set_progress_handler``): the query is aborted after ``max_steps`` progress callbacks
  (each ``STEP_OPS`` virtual-machine instructions: deterministic, so a task's outcome does not depend
  on the machine's load) or ``max_seconds`` of wall time, whichever comes first (a backstop);
- a **row cap** (only ``max_rows + 1`` rows are ever fetched) and a **result size** cap: the rendered
  CSV is cut to ``max_chars`` characters with a stated note of what was dropped.

Queries arrive as JSON strings: one statement, at most ``max_query_chars`` characters, no NUL and
no lone surrogates (not UTF-8); anything else is a ``SQLError`` whose message the tool returns.
"""

from __future__ import annotations

import csv
import io
import sqlite3
import time
from dataclasses import dataclass

STEP_OPS = 1000  # VM instructions between progress callbacks
ALLOWED_FUNCTIONS = frozenset(
    {
        "abs",
        "avg",
        "coalesce",
        "count",
        "group_concat",
        "ifnull",
        "iif",
        "instr",
        "length",
        "lower",
        "ltrim",
        "max",
        "min",
        "nullif",
        "round",
        "rtrim",
        "sign",
        "substr",
        "substring",
        "sum",
        "total",
        "trim",
        "typeof",
        "upper",
    }  # fmt: skip
)  # pure, output no longer than their input; printf, replace, zeroblob, randomblob etc. are refused
_LIMITS = {  # sqlite3 limit -> value while the agent queries
    "SQLITE_LIMIT_LENGTH": 100_000,  # largest string or blob
    "SQLITE_LIMIT_SQL_LENGTH": 20_000,
    "SQLITE_LIMIT_COLUMN": 64,
    "SQLITE_LIMIT_EXPR_DEPTH": 64,
    "SQLITE_LIMIT_COMPOUND_SELECT": 16,
    "SQLITE_LIMIT_FUNCTION_ARG": 8,
    "SQLITE_LIMIT_ATTACHED": 0,
    "SQLITE_LIMIT_LIKE_PATTERN_LENGTH": 200,
    "SQLITE_LIMIT_VARIABLE_NUMBER": 0,
    "SQLITE_LIMIT_TRIGGER_DEPTH": 1,
    "SQLITE_LIMIT_WORKER_THREADS": 0,
}


class SQLError(Exception):
    """A query the sandbox refuses or that fails: the message is what the agent sees after ``error:``."""


@dataclass(frozen=True)
class SandboxLimits:
    """``max_rows``: rows returned; ``max_chars``: characters of the rendered result;
    ``max_steps``: progress callbacks (x ``STEP_OPS`` VM instructions) a query may take;
    ``max_seconds``: wall-clock backstop; ``max_query_chars``: longest SQL accepted."""

    max_rows: int = 50
    max_chars: int = 4000
    max_steps: int = 20_000
    max_seconds: float = 2.0
    max_query_chars: int = 4000


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to at most ``max_chars`` characters (0: no cap), with a stated note when cut."""
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    note = f"\n[truncated: showing {{}} of {len(text)} characters; results are cut at {max_chars}]"
    keep = max(0, max_chars - len(note.format(max_chars)))
    return text[:keep] + note.format(keep)


def _text(v: str) -> str | None:
    return v or None  # an empty CSV field is NULL


def _cell(v: object) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bytes):
        return "x'" + v[:64].hex() + ("..." if len(v) > 64 else "") + "'"
    return str(v)


class Sandbox:
    """One task's database: ``tables`` maps a name to its CSV text (header row first; columns whose
    every value is an integer become INTEGER; an empty field is NULL). ``query(sql)`` returns the
    result as CSV text."""

    def __init__(self, tables: dict[str, str], limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.tables = {name.lower() for name in tables}
        self.schema: dict[str, list[tuple[str, str]]] = {}
        db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        db.text_factory = lambda b: b.decode("utf-8", "replace")  # never a decode error on output
        for name, text in tables.items():
            header, *rows = list(csv.reader(io.StringIO(text)))
            types = [
                "INTEGER" if rows and all(r[j].lstrip("-").isdigit() for r in rows) else "TEXT"
                for j in range(len(header))
            ]
            self.schema[name] = list(zip(header, types, strict=True))
            cols = ", ".join(f'"{c}" {t}' for c, t in self.schema[name])
            db.execute(f'CREATE TABLE "{name}" ({cols})')
            conv = [int if t == "INTEGER" else _text for t in types]
            db.executemany(
                f'INSERT INTO "{name}" VALUES ({", ".join("?" * len(header))})',
                ([f(v) for f, v in zip(conv, r, strict=True)] for r in rows),
            )
        db.execute("PRAGMA query_only = 1")
        for limit, value in _LIMITS.items():
            db.setlimit(getattr(sqlite3, limit), value)
        db.set_authorizer(self._authorize)
        self.db, self.refused = db, ""
        self._deadline, self._steps = 0.0, 0

    def describe(self) -> str:
        """The tables and their columns, one line each (what the task's prompt shows)."""
        return "\n".join(
            f"{name}({', '.join(f'{c} {t}' for c, t in cols)})" for name, cols in self.schema.items()
        )

    def _authorize(self, action: int, a1: str | None, a2: str | None, db: str | None, src: str | None) -> int:
        ok = (
            action == sqlite3.SQLITE_SELECT
            or action == getattr(sqlite3, "SQLITE_RECURSIVE", 33)
            or (action == sqlite3.SQLITE_READ and self._readable(a1, a2, db))
            or (action == sqlite3.SQLITE_FUNCTION and (a2 or "").lower() in ALLOWED_FUNCTIONS)
        )
        if not ok:
            what = a2 if action == sqlite3.SQLITE_FUNCTION else a1
            self.refused = f"only SELECT over the tables {sorted(self.tables)} is allowed" + (
                f" (refused: {what})" if what else ""
            )
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    def _readable(self, table: str | None, column: str | None, db: str | None) -> bool:
        """A task table's column (``db`` "main", or None for ``count(*)``), or the row count of a
        common table expression (no column, no database): never the schema or another database."""
        if (table or "").lower() in self.tables:
            return db in ("main", None)
        return db is None and not column

    def _progress(self) -> int:
        self._steps += 1
        return int(self._steps > self.limits.max_steps or time.perf_counter() > self._deadline)

    def query(self, sql: str) -> str:
        """Run one read-only statement; the first ``max_rows`` rows as CSV (header first), cut to
        ``max_chars``. Raises ``SQLError`` with a one-line reason."""
        lim = self.limits
        if not isinstance(sql, str) or not sql.strip():
            raise SQLError("the query is empty")
        if len(sql) > lim.max_query_chars:
            raise SQLError(f"the query has {len(sql)} characters: at most {lim.max_query_chars}")
        if "\x00" in sql:
            raise SQLError("the query contains a NUL character")
        try:
            sql.encode("utf-8")
        except UnicodeEncodeError:
            raise SQLError("the query is not valid UTF-8 text") from None
        self.refused, self._steps = "", 0
        self._deadline = time.perf_counter() + lim.max_seconds
        self.db.set_progress_handler(self._progress, STEP_OPS)
        try:
            cur = self.db.execute(sql)
            rows = cur.fetchmany(lim.max_rows + 1)
            header = [d[0] for d in cur.description or []]
        except sqlite3.Warning as e:  # e.g. several statements
            raise SQLError(str(e)) from None
        except sqlite3.Error as e:
            msg = str(e)
            if "interrupted" in msg:
                ops, secs = lim.max_steps * STEP_OPS, lim.max_seconds
                msg = f"the query ran past its budget ({ops} steps or {secs:g} s)"
            elif "not authorized" in msg and self.refused:
                msg = f"not authorized: {self.refused}"
            raise SQLError(msg) from None
        finally:
            self.db.set_progress_handler(None, 0)
        if not header:
            raise SQLError("the statement returned no result table")
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(header)
        w.writerows([_cell(v) for v in r] for r in rows[: lim.max_rows])
        text = out.getvalue().rstrip("\n")
        if len(rows) > lim.max_rows:
            text += f"\n[only the first {lim.max_rows} rows are shown]"
        elif not rows:
            text += "\n(no rows)"
        return truncate(text, lim.max_chars)

    def close(self) -> None:
        self.db.close()
