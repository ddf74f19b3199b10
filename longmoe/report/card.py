"""`longmoe report`: one report card from every committed result JSON (benchmarks, recipes, the demo).

Each result file is one section: its headline numbers beside the baseline they are read against and the
noise the run recorded, then where the numbers came from (commit, date, machine, threads, command, wall
time). A file that does not record one of those says "not recorded" instead of guessing. The README's
headline table is rendered here too, so no number in it is typed by hand (``python -m bench.tables``
writes it between markers; a test fails when it is stale).

Reads JSON only: no torch, no model, no stage (an import-linter contract keeps it so).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longmoe.errors import UserError
from longmoe.report.headlines import HEADLINES
from longmoe.report.rules import Headline, violations

ROOT = Path(__file__).resolve().parents[2]  # the checkout (longmoe/report/card.py)
DEFAULT_DIRS = ("bench/results", "docs/results")  # relative to the repository root
NOT_RECORDED = "not recorded"
PROVENANCE_FIELDS = ("commit", "date", "machine", "threads", "command", "wall_s", "peers")


class ReportError(UserError):
    """A result file that cannot be read (malformed JSON, not an object) or a missing results folder."""


@dataclass(frozen=True)
class Result:
    """One result file: its section name (the file stem, ``_results`` dropped) and parsed content."""

    name: str
    path: Path
    data: dict[str, Any]

    @property
    def smoke(self) -> bool:
        """A ``--quick`` run: checks the script works; its numbers are not results."""
        return self.name.endswith("_quick")


def collect(dirs: Iterable[Path]) -> list[Result]:
    """Every ``*.json`` in ``dirs`` (not recursive), sorted by section name within each folder."""
    out: list[Result] = []
    for d in dirs:
        if not d.is_dir():
            raise ReportError(f"{d}: no such results folder")
        for p in sorted(d.glob("*.json")):
            try:
                data = json.loads(p.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ReportError(f"{p}: not valid JSON ({e})") from None
            if not isinstance(data, dict):
                raise ReportError(f"{p}: expected a JSON object at the top, found {type(data).__name__}")
            out.append(Result(p.stem.removesuffix("_results"), p, data))
    return out


def default_dirs(root: Path = ROOT) -> list[Path]:
    return [root / d for d in DEFAULT_DIRS]


def provenance(data: dict[str, Any]) -> dict[str, str]:
    """Commit, date, machine, threads, command and wall time of a result, each "not recorded" if absent.

    New files carry a ``provenance`` object (``bench.common.provenance``); older benchmark files only a
    ``machine`` object (torch version, threads, CPU architecture), read as far as it goes.
    """
    p = data.get("provenance") or {}
    m = data.get("machine") or {}
    machine = p.get("machine") or " ".join(str(m[k]) for k in ("cpu", "gpu") if m.get(k)) or None
    if machine and m.get("torch") and "torch" not in machine:
        machine = f"{machine}, torch {m['torch']}"
    raw = {
        "commit": p.get("commit"),
        "date": p.get("date"),
        "machine": machine,
        "threads": p.get("threads", m.get("threads")),
        "command": p.get("command"),
        "wall_s": p.get("wall_s"),
        "peers": ", ".join(f"{k} {v}" for k, v in (p.get("peers") or {}).items()) or None,
    }
    out = {}
    for k, v in raw.items():
        if v is None or v == "":
            out[k] = NOT_RECORDED
        elif k == "wall_s":
            out[k] = f"{float(v):,.0f} s"
        else:
            out[k] = str(v)
    return out


# ---- headline numbers, one function per section; a KeyError means the file's layout changed ----------


def ordered(results: list[Result]) -> list[Result]:
    """Sections in ``HEADLINES`` order (the demo first), then the rest as collected."""
    rank = {k: i for i, k in enumerate(HEADLINES)}
    return sorted(results, key=lambda r: rank.get(r.name, len(rank)))


def headlines(r: Result) -> list[Headline]:
    fn = HEADLINES.get(r.name)
    if fn is None or r.smoke:
        return []
    try:
        hs = fn(r.data)
    except (KeyError, TypeError, ValueError, StopIteration, ZeroDivisionError) as e:
        raise ReportError(f"{r.path}: headline numbers not found ({type(e).__name__}: {e})") from None
    for h in hs:  # the headline rules (longmoe/report/headlines.py, docs/benchmarks.md)
        if bad := violations(h):
            raise ReportError(f"{r.path}: README headline {h.label!r} {'; '.join(bad)}")
    return hs


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(p)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def headline_table(results: list[Result], root: Path = ROOT) -> str:
    """The README's short table: the headline numbers marked ``readme``, each with its source file."""
    head = ["result", "model", "longmoe", "baseline (same run)", "noise", "source (commit)"]
    lines = [_row(head), "|" + "---|" * len(head)]
    for r in ordered(results):
        for h in headlines(r):
            if h.readme:
                src = f"`{_rel(r.path, root)}` ({h.commit or provenance(r.data)['commit']})"
                lines.append(_row([h.label, h.model, h.value, h.baseline, h.noise, src]))
    return "\n".join(lines)


def render(results: list[Result], root: Path = ROOT) -> str:
    """The whole report card (deterministic: same files, same text, so ``--check`` can compare)."""
    full = [r for r in ordered(results) if not r.smoke]
    smoke = [r for r in results if r.smoke]
    lines = [
        "# longmoe report card",
        "",
        "Written by `longmoe report` from the committed result files; do not edit by hand. Each section is "
        "one file: its headline numbers against their baseline, the noise it recorded, and its provenance "
        f'("{NOT_RECORDED}" where the file does not say). Tables: [benchmarks.md](benchmarks.md).',
        "",
    ]
    for r in full:
        lines += [f"## {r.name}", "", f"Source: `{_rel(r.path, root)}`", ""]
        hs = headlines(r)
        if hs:
            lines += [_row(["measure", "model", "value", "baseline", "noise"]), "|---|---|---|---|---|"]
            lines += [_row([h.label, h.model or NOT_RECORDED, h.value, h.baseline, h.noise]) for h in hs]
        else:
            lines.append(
                "No headline numbers defined for this file (`longmoe/report/headlines.py` HEADLINES)."
            )
        p = provenance(r.data)
        lines += ["", "Provenance: " + "; ".join(f"{k} {p[k]}" for k in PROVENANCE_FIELDS), ""]
    if smoke:
        lines += ["## Smoke runs (`--quick`: the scripts work; not results)", ""]
        lines += [_row(["file", "commit", "date", "machine"]), "|---|---|---|---|"]
        for r in smoke:
            p = provenance(r.data)
            lines.append(_row([f"`{_rel(r.path, root)}`", p["commit"], p["date"], p["machine"]]))
        lines.append("")
    return "\n".join(lines)


# ---- the `longmoe report` command -----------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results", type=Path, action="append", metavar="DIR",
        help=f"a folder of result JSON files (repeatable; default: {', '.join(DEFAULT_DIRS)})",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("report.md"), help="where to write (report.md)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if --out differs from what would be written",
    )


def run(args: argparse.Namespace) -> int:
    text = render(collect(args.results or default_dirs()))
    if args.check:
        current = args.out.read_text() if args.out.exists() else None
        if current != text:
            print(f"{args.out} is stale: run `longmoe report --out {args.out}`")
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0
