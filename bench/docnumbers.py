"""Every result number in docs/*.md prose comes from a file: a script-written block or a citation.

A number with a unit of a result (×, x, ms, tok/s, s, %, GB/MB/KB and their binary forms, nats) in
docs/*.md is *covered* when it is

- inside a block a script writes, ``<!-- NAME:start -->`` .. ``<!-- NAME:end -->`` (``bench/tables.py``
  rewrites them and ``tests/report/test_report_tables.py`` checks them), or
- followed on its line, before the next number, by a citation ``<!-- from: PATH#KEY -->``: PATH a JSON
  file in the repository (or a script-written markdown report, cited by a quoted anchor: the first
  number after the one occurrence of ``#"text"``), KEY a dotted path into it (list items by index; a
  part holding dots, spaces or slashes is double-quoted, ``rows.9."fwd+bwd s"``; ``KEY*1000`` scales the
  value, e.g. seconds to ms; ``KEY / KEY`` is the ratio of two values of the same file, e.g. a speed-up;
  a number printed with ``%`` reads a fraction, so the value is multiplied by 100; ``min:KEY`` /
  ``max:KEY`` with ``[]`` for every item of a list cite a range's ends over rows). The citation
  resolves and the printed number equals the value at the printed precision.

A number of any form (no unit, ``7.6e-06``) directly before a citation, only spaces or ``*`` between, is
checked the same way: a citation always covers the number it follows, unit or not (``4.07-4.92`` with a
citation after each end, ``7.4 and 10.2 GB/s``).

Exempt by rule (``exempt``), because they are settings or sizes, not results: numbers in code (fenced or
inline), targets, limits and tolerances (after ≤ ≥ < > ± or the words target / at least / at most / under
/ up to / within / above / below / budget / limit / timeout / every / last / fit / margin (of) / default,
or a ``key=value`` setting), sizes of inputs (a number followed by "of", "per", "budget", "tensor",
"file", "chunk", "cache", "buffer", "window", "prompt", "context", "RAM", "memory", "disk", "device",
"shard", a confidence level ("95% interval", "95% CI", "95% confidence"), or a setting's "SLO" / "target"
/ "timeout" / "deadline" / "backstop"), shapes (``3×3``, ``15 × 15``: a ``×`` between two operands, not a
ratio) and multiples of a setting (``4× and 16× the training length``, ``2x (1024)``: lengths and learning
rates an experiment was run at). A script-written block is exempt only in a document ``bench/tables.py``
rewrites and checks (``tests/test_docs_numbers.py``).

``UNCITED`` (``bench/docnumbers_uncited.json``) lists the numbers written before this rule, per file, by
their text and the words before them: those may stay until their paragraph is next edited; a new or
edited one is not in it and fails ``tests/test_docs_numbers.py``. ``python -m bench.docnumbers --update``
rewrites the list (it may only shrink in review: an added entry is a hand-typed number).

After a benchmark is rerun, ``python -m bench.docnumbers --refresh`` reprints each cited number that no
longer matches its source and lists every change: the words around a number (faster, ahead, met) are the
writer's to re-read.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
UNCITED = ROOT / "bench" / "docnumbers_uncited.json"

UNITS = r"(?:×|x\b|ms\b|tok/s\b|s\b|%|[KMG]i?B\b|nats?\b)"
NUMBER = re.compile(rf"(?<![\w.\-/#])(?P<num>\d[\d,]*(?:\.\d+)?)\s?(?P<unit>{UNITS})")
# A number the citation right after it covers, whatever its form: "7.4 <!-- from: ... -->", "7.6e-06 <!--".
# A "-" before it is a range's dash ("4.07 <!-- -->-4.92"), not a sign: no cited value is negative.
CITED_BARE = re.compile(
    rf"(?<![\w.#/])(?P<num>\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)(?:\s?(?P<unit>{UNITS}))?[\s*]*$"
)
PRINTED = re.compile(r"(?P<num>\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)")
KEY = r'(?:"[^"]*"|[^\s*"/])+'  # dotted parts; a quoted part may hold dots, spaces and slashes
CITE = re.compile(
    rf"<!--\s*from:\s*(?P<path>[^#\s]+)#(?P<key>{KEY})(?:\s*/\s*(?P<over>{KEY}))?"
    r"(?:\*(?P<scale>[\d.e+-]+))?\s*-->"
)
KEY_PART = re.compile(r'"(?P<quoted>[^"]*)"|(?P<plain>[^."]+)')
DOTTED = re.compile(r'(?:"[^"]*"|[^."]+)(?:\.(?:"[^"]*"|[^."]+))*')
BLOCK_START = re.compile(r"<!--\s*[\w:.-]+:start\s*-->")
BLOCK_END = re.compile(r"<!--\s*[\w:.-]+:end\s*-->")
CODE = re.compile(r"`[^`]*`")
LIMIT_BEFORE = re.compile(
    r"(?:[≤≥<>]=?|\w="
    r"|\b(?:target|at least|at most|under|up to|within|above|below|budget|limit|timeout|max|min|every|last"
    r"|fits?|margin|default)\b(?:\s+of)?)"
    r"[\s~(±]*$",
    re.IGNORECASE,
)
SIZE_AFTER = re.compile(
    r"^\s*(?:of\b|per\b|budget|tensor|file|chunk|cache|buffer|window|prompt|context|RAM|memory|disk"
    r"|shards?\b|SLO\b|target|timeout|deadline|backstop|devices?\b"
    r"|intervals?\b|CI\b|confidence\b)",  # a confidence level: the 95% interval
    re.IGNORECASE,
)
# A × between two operands is a shape or a product (3×3, 15 × 15, 2 × ep = 2), not a ratio (2.9× faster):
# no space on either side of the sign and a digit after it, or a space on both and an operand after it.
PRODUCT_TIGHT = re.compile(r"\d")
PRODUCT_SPACED = re.compile(r" (?:\d|[a-z_]\w* ?=)")
# Multiples of a setting an experiment ran at: "1x, 2x and 8x the window", "10× the learning rate",
# "4× (2048)" -- the multiplier names a length or a rate that was chosen, not measured.
SETTING_MULTIPLE = re.compile(
    r"^(?:(?:\s*(?:,|and|or|to|/|–|-)\s*\d[\d.]*\s?[×x])*\s+(?:the |its )?"
    r"(?:window|(?:training|train) length|learning rate|lr)\b|\s*\(\d[\d,]*\))",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Found:
    """One result number in a document: where, what, and the citation that covers it (if any)."""

    doc: str
    line: int
    text: str  # the number and unit as printed
    before: str  # up to 40 characters before it on its line: what the uncited list keys it by
    cite: re.Match | None
    column: int = -1  # where the number starts on its line (``refresh`` rewrites it there)


def exempt(line: str, m: re.Match) -> bool:
    """Settings, sizes and shapes, not results (the rule in the module docstring)."""
    before, after = line[: m.start()], line[m.end() :]
    if LIMIT_BEFORE.search(before) or SIZE_AFTER.match(after):
        return True
    if m["unit"] in ("×", "x"):
        spaced = line[m.start("unit") - 1] == " "
        product = (PRODUCT_SPACED if spaced else PRODUCT_TIGHT).match(line, m.end("unit"))
        return bool(product or SETTING_MULTIPLE.match(after))
    return False


def _before(line: str, column: int) -> str:
    """Up to 40 characters before ``column``, whitespace folded: what the uncited list keys a number by."""
    return " ".join(line[max(0, column - 40) : column].split())


def scan(text: str, doc: str) -> list[Found]:
    """Every non-exempt result number outside script-written blocks and code, with its citation."""
    out: list[Found] = []
    in_block = in_fence = False
    for i, raw in enumerate(text.splitlines(), 1):
        if raw.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if BLOCK_START.search(raw):
            in_block = True
        if in_block or in_fence:
            in_block = in_block and not BLOCK_END.search(raw)
            continue
        line = CODE.sub(lambda m: " " * len(m.group()), raw)  # keep offsets, drop inline code
        cites = list(CITE.finditer(line))
        line = CITE.sub(lambda m: " " * len(m.group()), line)
        # The number right before each citation, unit or not: the citation is its own.
        direct = {c.start(): b for c in cites if (b := CITED_BARE.search(line, 0, c.start()))}
        starts = sorted(b.start() for b in direct.values())
        hits = [m for m in NUMBER.finditer(line) if not exempt(line, m) and m.start() not in starts]
        found: list[Found] = []
        for m in hits:  # a citation after it, before the next number (with a unit, or cited directly)
            nxt = min(
                [h.start() for h in hits if h.start() > m.start()] + [s for s in starts if s > m.start()],
                default=len(line),
            )
            cite = next((c for c in cites if m.end() <= c.start() < nxt), None)
            found.append(Found(doc, i, m.group().strip(), _before(line, m.start()), cite, m.start()))
        for c in cites:
            if (b := direct.get(c.start())) is not None:
                text = line[b.start() : b.end("unit") if b["unit"] else b.end("num")]
                found.append(Found(doc, i, text, _before(line, b.start()), c, b.start()))
        claimed = {f.cite.start() for f in found if f.cite is not None}
        for c in cites:  # a citation that covers no number checks nothing: ``check_citation`` fails it
            if c.start() not in claimed:
                found.append(Found(doc, i, "", _before(line, c.start()), c, c.start()))
        out.extend(sorted(found, key=lambda f: f.column))
    return out


def key_parts(key: str) -> list[str]:
    """``rows.9."fwd+bwd s"`` -> ``["rows", "9", "fwd+bwd s"]``: dotted parts, a quoted one taken whole."""
    if not DOTTED.fullmatch(key):
        raise ValueError(f"{key}: not a dotted key (quote a part holding dots, spaces or slashes)")
    return [m["quoted"] if m["quoted"] is not None else m["plain"] for m in KEY_PART.finditer(key)]


MD_NUMBER = re.compile(r"[-−]?\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?")


def resolve_markdown(path: str, text: str, key: str) -> float:
    """The first number after the quoted anchor ``key``, which occurs exactly once in the markdown ``text``
    (a report a script wrote under docs/results/, whose numbers no JSON holds, e.g. a paired difference)."""
    parts = key_parts(key)
    if len(parts) != 1 or not key.startswith('"'):
        raise ValueError(f'{path}#{key}: a markdown source is cited by one quoted anchor, #"text before it"')
    anchor = parts[0]
    if (n := text.count(anchor)) != 1:
        raise ValueError(f"{path}#{key}: the anchor occurs {n} times (it must occur once)")
    m = MD_NUMBER.search(text, text.index(anchor) + len(anchor))
    if m is None:
        raise ValueError(f"{path}#{key}: no number after the anchor")
    return float(m.group().replace(",", "").replace("−", "-"))


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def resolve(path: str, key: str, root: Path = ROOT) -> float:
    """The number at ``key`` (dotted; list indices as integers; quoted parts) in the JSON file ``path``,
    or after the anchor ``key`` in the markdown file ``path`` (``resolve_markdown``).

    A range over rows cites its ends as ``min:KEY`` and ``max:KEY`` with ``[]`` for "every item of this
    list" (``min:results.[].speedup_fwd."x"``): the ends follow the file when a rerun moves them to
    other rows; rows without the key are skipped."""
    f = root / path
    if not f.is_file():
        raise ValueError(f"{path}: no such file")
    if f.suffix == ".md":
        return resolve_markdown(path, f.read_text(), key)
    agg, _, rest = key.partition(":") if key.startswith(("min:", "max:")) else ("", "", key)
    nodes = [json.loads(f.read_text())]
    for part in key_parts(rest):
        found = []
        for node in nodes:
            if part == "[]" and agg and isinstance(node, list):
                found.extend(node)
                continue
            try:
                found.append(node[int(part)] if isinstance(node, list) else node[part])
            except (KeyError, IndexError, ValueError, TypeError):
                if not agg:
                    raise ValueError(f"{path}#{key}: no {part!r} there") from None
        nodes = found
    if agg:
        values = [float(v) for v in nodes if _is_number(v)]
        if not values:
            raise ValueError(f"{path}#{key}: no number at any row")
        return min(values) if agg == "min" else max(values)
    if not _is_number(nodes[0]):
        raise ValueError(f"{path}#{key}: not a number ({type(nodes[0]).__name__})")
    return float(nodes[0])


def cited_value(f: Found, root: Path = ROOT) -> float:
    """The value ``f``'s citation names, in the printed unit (scaled, divided, ×100 for a %)."""
    assert f.cite is not None
    value = resolve(f.cite["path"], f.cite["key"], root) * float(f.cite["scale"] or 1)
    if f.cite["over"]:
        value /= resolve(f.cite["path"], f.cite["over"], root)
    return value * 100 if f.text.endswith("%") else value


def printed_number(f: Found) -> tuple[str, int]:
    """The printed digits of ``f`` (thousands separators dropped) and their number of decimals (of the
    mantissa, for ``7.6e-06``)."""
    m = PRINTED.match(f.text)
    assert m is not None
    printed = m["num"].replace(",", "")
    mantissa = printed.split("e")[0]
    return printed, len(mantissa.split(".")[1]) if "." in mantissa else 0


def reprint(value: float, f: Found) -> str:
    """``value`` printed as ``f``'s number is: its decimals, its exponent form, its thousands separators."""
    printed, decimals = printed_number(f)
    if "e" in printed:
        return f"{value:.{decimals}e}"
    return f"{value:,.{decimals}f}" if "," in f.text else f"{value:.{decimals}f}"


def check_citation(f: Found, root: Path = ROOT) -> str | None:
    """None when the cited value, printed at the document's precision, is the printed number."""
    if not f.text:
        return f"{f.doc}:{f.line}: a citation covers no number (put it right after the number it backs)"
    printed, decimals = printed_number(f)
    try:
        value = cited_value(f, root)
    except (ValueError, ZeroDivisionError) as e:
        return f"{f.doc}:{f.line}: {f.text}: {e}"
    if "e" in printed:
        if float(reprint(value, f)) != float(printed):
            over = f" / {f.cite['over']}" if f.cite["over"] else ""
            return (
                f"{f.doc}:{f.line}: prints {f.text}, {f.cite['path']}#{f.cite['key']}{over} holds {value:.6g}"
            )
        return None
    if abs(round(value, decimals) - float(printed)) > 10**-decimals / 2 + 1e-9:
        over = f" / {f.cite['over']}" if f.cite["over"] else ""
        return f"{f.doc}:{f.line}: prints {f.text}, {f.cite['path']}#{f.cite['key']}{over} holds {value:.6g}"
    return None


def refresh(text: str, doc: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """``text`` with every cited number that disagrees with its source reprinted from it, at the printed
    precision (and thousands separators where the old number had them), and one line per change for a
    reader: the number is the file's, but the sentence around it (faster, ahead, met) is the writer's to
    re-read. A citation that does not resolve is left as it is (the check reports it)."""
    lines = text.splitlines(keepends=True)
    changes: list[str] = []
    for f in reversed(scan(text, doc)):  # right to left: earlier columns stay valid
        if f.cite is None or not f.text or check_citation(f, root) is None:
            continue
        try:
            value = cited_value(f, root)
        except (ValueError, ZeroDivisionError):
            continue
        num = reprint(value, f)
        old = PRINTED.match(f.text)["num"]  # type: ignore[index]
        line = lines[f.line - 1]
        assert line[f.column : f.column + len(old)] == old, (doc, f.line, old)
        lines[f.line - 1] = line[: f.column] + num + line[f.column + len(old) :]
        changes.append(f"{doc}:{f.line}: {old} -> {num} | {f.before} ...")
    return "".join(lines), changes[::-1]


GENERATED = {
    "report.md"
}  # written whole by `longmoe report`; tests/report/test_report_tables.py checks it byte for byte


def all_found(root: Path = ROOT) -> list[Found]:
    docs = [p for p in sorted((root / "docs").glob("*.md")) if p.name not in GENERATED]
    return [x for p in docs for x in scan(p.read_text(), p.name)]


def uncited_keys(found: list[Found]) -> Counter:
    return Counter(f"{f.doc} | {f.before} | {f.text}" for f in found if f.cite is None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", action="store_true", help="rewrite bench/docnumbers_uncited.json")
    ap.add_argument(
        "--refresh",
        action="store_true",
        help="after a rerun: reprint every cited number that disagrees with its source, and list each change "
        "(re-read the sentence around it: the words are not rewritten)",
    )
    args = ap.parse_args(argv)
    if args.refresh:
        for p in sorted(DOCS.glob("*.md")):
            if p.name in GENERATED:
                continue
            new, changes = refresh(p.read_text(), p.name)
            if changes:
                tmp = p.with_suffix(".md.tmp")
                tmp.write_text(new)
                tmp.replace(p)
                print("\n".join(changes))
    found = all_found()
    bad = [e for f in found if f.cite is not None and (e := check_citation(f))]
    keys = uncited_keys(found)
    for e in bad:
        print(e)
    if args.update:
        tmp = UNCITED.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(keys.items())), indent=1, ensure_ascii=False) + "\n")
        tmp.replace(UNCITED)
        print(f"wrote {UNCITED.relative_to(ROOT)}: {sum(keys.values())} uncited numbers")
    cited = sum(f.cite is not None for f in found)
    print(f"{len(found)} result numbers in docs/*.md: {cited} cited, {sum(keys.values())} uncited")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
