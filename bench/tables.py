"""Every results table in README.md and docs/benchmarks.md, rewritten from the committed result files.

A table lives between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; its source is fixed by NAME:

- ``bench:<b>``: ``bench/results/<b>.md``, the table ``bench/<b>.py`` rendered from its numbers and wrote
  beside ``<b>.json`` in the same call (``bench.common.write_results``; newer JSONs carry the table's
  SHA-256, checked here, so a table cannot drift from its JSON);
- ``demo``, ``demo_run`` and ``recall``: ``docs/results/demo_results.json``, through the demo's own renderers
  (``longmoe.pipelines.demo.report``);
- ``mqar_long``: ``docs/results/mqar_long_results.json``, through ``longmoe.pipelines.mqar.long_report``;
- ``headline``: the README's headline numbers, ``longmoe.report.card.headline_table`` over every result JSON;
- ``vision_extract:documents*`` (docs/vision.md): the four-family extraction runs in
  ``docs/results/vision_extract_documents*_results.json``, through
  ``longmoe.pipelines.vision_extract.publish``.

``python -m bench.tables`` rewrites them all; ``--check`` writes nothing and exits 1 naming each stale
table (``tests/report/test_report_tables.py`` runs it in ``make test``); ``--demo RUN_DIR`` first
copies a new demo run's ``report.json`` to ``docs/results/demo_results.json``; ``--vision-extract RUN_DIR
NAME`` first copies a finished vision_extract run into ``docs/results``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

from longmoe.pipelines.vision_extract.publish import PublishError, document_tables, publish
from longmoe.report.card import ReportError, collect, default_dirs, headline_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEMO_JSON = ROOT / "docs" / "results" / "demo_results.json"
DOCS = (
    "README.md",
    "docs/agent.md",
    "docs/benchmarks.md",
    "docs/deploy.md",
    "docs/distributed.md",
    "docs/interop.md",
    "docs/model.md",
    "docs/moe.md",
    "docs/serve.md",
    "docs/vision.md",
)
BENCH_DOC = "docs/benchmarks.md"
NEW_TABLES_HERE = "<!-- bench:new-tables-here -->"  # where a benchmark's first table is appended
BLOCK = re.compile(r"<!-- (?P<name>[\w:-]+):start -->\n(?P<body>.*?)\n?<!-- (?P=name):end -->", re.DOTALL)


def table_sha256(table_md: str) -> str:
    return hashlib.sha256(table_md.strip().encode()).hexdigest()


def _bench_table(name: str, root: Path) -> str:
    md, js = root / "bench" / "results" / f"{name}.md", root / "bench" / "results" / f"{name}.json"
    if not md.exists() or not js.exists():
        raise ReportError(f"table bench:{name}: {md.relative_to(root)} and {js.name} must both exist")
    table = md.read_text().strip()
    want = json.loads(js.read_text()).get("table_sha256")
    if want is not None and want != table_sha256(table):
        raise ReportError(f"{md.relative_to(root)}: does not match the table recorded in {js.name}")
    return table


def _demo_tables(root: Path) -> dict[str, str]:
    from longmoe.pipelines.demo.report import recall_table, report_table, run_summary  # the demo's own
    from longmoe.pipelines.demo.result import LengthEval, RecallResult

    path = root / "docs" / "results" / "demo_results.json"
    d = json.loads(path.read_text())
    out = {
        "demo": report_table(argparse.Namespace(eval=[LengthEval(**e) for e in d["eval"]])),
        "demo_run": run_summary(d),
    }
    if d.get("recall"):  # a transcribed file may lack fields the tables do not read
        rc = d["recall"]
        out["recall"] = recall_table(
            RecallResult(**{f.name: rc.get(f.name) for f in dataclasses.fields(RecallResult)})
        )
    return out


def _mqar_long_table(root: Path) -> dict[str, str]:
    """``mqar_long``: recall at 4K-64K+ tokens, ``docs/results/mqar_long_results.json`` through the MQAR
    recipe's own renderer (``longmoe.pipelines.mqar.long_report``)."""
    from longmoe.pipelines.mqar.long_report import PUBLISHED_JSON, render

    path = root / PUBLISHED_JSON
    return {"mqar_long": render(json.loads(path.read_text()))} if path.exists() else {}


def sources(root: Path = ROOT) -> dict[str, str]:
    """Table name -> the text that belongs between its markers."""
    results = root / "bench" / "results"  # a table renders a result JSON; a lone .md (a profile) is none
    out = {f"bench:{p.stem}": _bench_table(p.stem, root) for p in sorted(results.glob("*.json"))}
    out.update(_demo_tables(root))
    out.update(document_tables(root))
    out.update(_mqar_long_table(root))
    out["headline"] = headline_table(collect(default_dirs(root)), root)
    return out


def rewrite(text: str, tables: dict[str, str], where: str) -> str:
    """``text`` with every marked table replaced by its source; an unknown name is an error."""

    def sub(m: re.Match) -> str:
        name = m["name"]
        if name not in tables:
            raise ReportError(f"{where}: table {name!r} has no source (bench/tables.py)")
        return f"<!-- {name}:start -->\n{tables[name]}\n<!-- {name}:end -->"

    return BLOCK.sub(sub, text)


def ensure_block(text: str, name: str, body: str) -> str:
    """Append a ``name`` block at ``NEW_TABLES_HERE`` (or the end) when the document has none yet."""
    if f"<!-- {name}:start -->" in text:
        return text
    block = f"<!-- {name}:start -->\n{body}\n<!-- {name}:end -->\n\n"
    if NEW_TABLES_HERE in text:
        return text.replace(NEW_TABLES_HERE, block + NEW_TABLES_HERE)
    return text.rstrip() + "\n\n" + block


def stale(root: Path = ROOT) -> list[str]:
    """The documents whose tables differ from what their sources would write (empty: all fresh)."""
    tables = sources(root)
    return [d for d in DOCS if (root / d).read_text() != rewrite((root / d).read_text(), tables, d)]


def write_all(root: Path = ROOT, add_bench: str | None = None) -> list[str]:
    """Rewrite every table in place (first adding a block for benchmark ``add_bench`` if it has none)."""
    tables = sources(root)
    changed = []
    for d in DOCS:
        text = (root / d).read_text()
        if add_bench and d == BENCH_DOC:
            text = ensure_block(text, f"bench:{add_bench}", "")
        new = rewrite(text, tables, d)
        if new != (root / d).read_text():
            (root / d).write_text(new)
            changed.append(d)
    return changed


def import_demo(run_dir: Path, root: Path = ROOT, allow_dirty: bool = False) -> Path:
    """Copy a demo run's ``report.json`` into the committed results: its own provenance when the run wrote
    one (``make demo`` does; a run from a dirty tree is refused unless ``allow_dirty``), else what is
    known at import."""
    src = run_dir / "report.json"
    if not src.exists():
        raise ReportError(f"{src}: no demo result here (run `longmoe demo --run-dir {run_dir}` first)")
    data = json.loads(src.read_text())
    prov = data.get("provenance") or {}
    if str(prov.get("commit") or "").endswith("+dirty") and not allow_dirty:
        raise ReportError(f"{src}: the run was made from a dirty tree ({prov['commit']}); rerun from a "
                          "commit, or pass --allow-dirty to keep it stamped")  # fmt: skip
    if prov:
        out = root / "docs" / "results" / "demo_results.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(out)
        return out
    mtime = datetime.datetime.fromtimestamp(src.stat().st_mtime, datetime.UTC)
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    data["provenance"] = {
        "commit": (commit.stdout.strip() + " (at import)") if commit.returncode == 0 else None,
        "date": mtime.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": socket.gethostname() + " (at import)",
        "threads": None,
        "command": "longmoe demo",
        "wall_s": None,
    }
    out = root / "docs" / "results" / "demo_results.json"
    out.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.tables", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table is stale")
    ap.add_argument("--demo", type=Path, metavar="RUN_DIR", help="first import RUN_DIR/report.json")
    ap.add_argument(
        "--vision-extract", nargs=2, metavar=("RUN_DIR", "NAME"),
        help="first copy a finished vision_extract run into docs/results/vision_extract_NAME_* "
        "(NAME documents, documents_patch4, ...)",
    )  # fmt: skip
    ap.add_argument("--arm", help="--vision-extract: the arm's label in the tables (default NAME)")
    ap.add_argument("--allow-dirty", action="store_true", help="--demo: accept a run made from a dirty tree")
    args = ap.parse_args(argv)
    try:
        if args.demo:
            print(f"wrote {import_demo(args.demo, allow_dirty=args.allow_dirty)}")
        if args.vision_extract:
            run_dir, name = args.vision_extract
            print(f"wrote {publish(Path(run_dir), name, ROOT, args.allow_dirty, args.arm)}")
        if args.check:
            bad = stale()
            for d in bad:
                print(f"{d}: a table differs from its result file: run `python -m bench.tables`")
            return 1 if bad else 0
        for d in write_all():
            print(f"rewrote tables in {d}")
    except (ReportError, PublishError) as e:
        print(f"bench.tables: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
