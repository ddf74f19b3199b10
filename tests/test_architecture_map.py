"""README's architecture map stays true: every path it names exists, and every subpackage of
``longmoe`` (two levels deep) is named in it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"(?<![\w./-])([A-Za-z_][\w]*(?:/|\.py))(?![\w])")


def map_block() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Architecture map")
    a = text.index("```", start)
    return text[a + 3 : text.index("```", a + 3)]


def entries() -> dict[str, list[str]]:
    """Each top-level entry of the map (``longmoe/ops/``, ``bench/``, ...) -> the names its text
    mentions (files and folders below it)."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in map_block().splitlines():
        top = re.match(r"^(\S+)\s", line + " ")
        sub = re.match(r"^  (\S+)", line)
        if top and not line.startswith(" "):
            current = top.group(1) if top.group(1) != "longmoe/" else ""
            if current:
                out[current] = []
            continue
        if sub and not line.startswith("   "):
            current = "longmoe/" + sub.group(1)
            out[current] = []
            line = line[2 + len(sub.group(1)) :]
        if current:
            out[current] += NAME.findall(line)
    return out


def test_every_named_path_exists():
    missing = []
    for entry, names in entries().items():
        base = ROOT / entry
        if not base.exists():
            missing.append(entry)
            continue
        where = base if base.is_dir() else base.parent
        for n in names:
            n = n.rstrip("/")
            if not (where / n).exists() and not any(where.rglob(n)) and not (ROOT / "longmoe" / n).exists():
                missing.append(f"{entry}: {n}")
    assert not missing, f"README's architecture map names paths that do not exist: {missing}"


def test_every_subpackage_is_named():
    es = entries()
    named = set(es)
    mentioned = {(e, n.rstrip("/")) for e, ns in es.items() for n in ns}
    absent = []
    for init in sorted((ROOT / "longmoe").glob("*/__init__.py")):
        if f"longmoe/{init.parent.name}/" not in named:
            absent.append(init.parent.name)
    for init in sorted((ROOT / "longmoe").glob("*/*/__init__.py")):
        parent, name = f"longmoe/{init.parent.parent.name}/", init.parent.name
        if (parent, name) not in mentioned:
            absent.append(f"{init.parent.parent.name}/{name}")
    assert not absent, f"subpackages missing from README's architecture map: {absent}"
