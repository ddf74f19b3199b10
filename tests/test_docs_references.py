"""Every reference into the docs resolves, so a renamed heading or renumbered section fails here.

Checked in longmoe/, bench/, docs/, tests/ and README.md (``.py`` and ``.md`` files):

- ``docs/<file>.md`` and ``docs/<file>.md#anchor``: the file exists and has the anchor (a GitHub heading
  slug or an explicit ``<a id="...">``);
- in Markdown files, relative links ``[text](target#anchor)``: the target exists (relative to the file)
  and, for a Markdown target, has the anchor;
- ``design.md §N.M`` citations (also lists such as ``docs/design.md §1.1, §5``, and bare ``§N`` inside
  docs/design.md): every number is a numbered heading of docs/design.md. Outside docs/ the citation is
  ``docs/design.md §N``; the short form ``design §N`` is refused, so citations stay greppable.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
SCANNED = ("longmoe", "bench", "docs", "tests", "README.md")
SUFFIXES = (".py", ".md")

_SEC = r"§\s*\d+(?:\.\d+)*"
# a design citation, "docs/design.md §1.1, §1.2, §5" (inside docs/ without "docs/"); never "design §N"
DESIGN_REF = re.compile(
    rf"(?P<dir>docs/)?\bdesign(?P<md>\.md)?\s*(?P<secs>{_SEC}(?:\s*(?:,|and|&)\s*{_SEC})*)"
)
SEC_NUMBER = re.compile(r"§\s*(\d+(?:\.\d+)*)")
# a repository path into docs/, optionally with an anchor; not part of a longer path (runs/docs/...)
DOCS_PATH = re.compile(r"(?<![\w./-])docs/(?P<path>[\w./-]+?\.md)(?:#(?P<anchor>[\w-]+))?(?![\w/-])")
MD_LINK = re.compile(r"\]\((?P<target>[^)\s#]*)(?:#(?P<anchor>[^)\s]+))?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
FENCE = re.compile(r"^\s*(```|~~~)")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: rendered text, lower case, punctuation dropped, spaces → '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images keep their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_|_(?!\w)", "", text)  # _emphasis_, not snake_case
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    """The heading lines of a Markdown text, outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            out.append(m.group(2))
    return out


def anchors_of(text: str) -> set[str]:
    """Every anchor a Markdown text defines: heading slugs (duplicates get -1, -2, ...) and explicit ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for h in headings(text):
        slug = github_slug(h)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    found.update(EXPLICIT_ANCHOR.findall(text))
    return found


def design_sections(text: str) -> set[str]:
    """Section numbers of the numbered headings of a design text ("1", "1.5", "1.5.1")."""
    out = set()
    for h in headings(text):
        if m := re.match(r"(\d+(?:\.\d+)*)\.?\s", h):
            out.add(m.group(1))
    return out


def _prose(text: str) -> str:
    """``text`` with code (fenced blocks, inline spans) blanked out, keeping every offset and newline."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    text = re.sub(r"^\s*(```|~~~).*?^\s*\1", blank, text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", blank, text)


@cache
def _file_anchors(path: Path) -> frozenset[str]:
    return frozenset(anchors_of(path.read_text(encoding="utf-8")))


def check_text(text: str, source: Path, root: Path = ROOT, sections: set[str] | None = None) -> list[str]:
    """Problems with the doc references in ``text`` (the content of ``source``); [] when all resolve.

    ``sections``: the design section numbers (default: read from ``root/docs/design.md``).
    """
    if sections is None:
        design = root / "docs" / "design.md"
        sections = design_sections(design.read_text(encoding="utf-8")) if design.exists() else set()
    problems: list[str] = []

    def line_of(pos: int) -> str:
        return f"{source}:{text.count(chr(10), 0, pos) + 1}"

    def check_anchor(target: Path, anchor: str | None, where: str, shown: str) -> None:
        if not target.exists():
            problems.append(f"{where}: {shown}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _file_anchors(target.resolve()):
            problems.append(f"{where}: {shown}: no heading or anchor #{anchor} in {target.name}")

    for m in DESIGN_REF.finditer(text):
        where = line_of(m.start())
        if not m.group("md"):
            problems.append(f"{where}: {m.group(0)!r}: cite the file, 'design.md §N'")
        elif not m.group("dir") and source.parts[:1] != ("docs",):
            problems.append(f"{where}: {m.group(0)!r}: outside docs/ cite 'docs/design.md §N'")
        for number in SEC_NUMBER.findall(m.group("secs")):
            if number not in sections:
                problems.append(f"{where}: design.md §{number}: no such section heading in docs/design.md")
    if source.name == "design.md":  # the design's own bare cross-references (§1.4, §5)
        for m in SEC_NUMBER.finditer(text):
            if m.group(1) not in sections:
                problems.append(f"{line_of(m.start())}: §{m.group(1)}: no such section heading")
    for m in DOCS_PATH.finditer(text):
        check_anchor(root / "docs" / m.group("path"), m.group("anchor"), line_of(m.start()), m.group(0))
    if source.suffix == ".md":
        for m in MD_LINK.finditer(_prose(text)):
            target, anchor = m.group("target"), m.group("anchor")
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            base = source if source.is_absolute() else root / source
            path = base if target == "" else base.parent / target
            check_anchor(path, anchor, line_of(m.start()), m.group(0)[2:-1])
    return list(dict.fromkeys(problems))  # a docs/ path inside a Markdown link is found twice


def scanned_files(root: Path = ROOT) -> list[Path]:
    files = []
    for name in SCANNED:
        p = root / name
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += [f for f in sorted(p.rglob("*")) if f.suffix in SUFFIXES and f.is_file()]
    return files


# ---- the repository ---------------------------------------------------------------------------------


def test_every_doc_reference_in_the_repository_resolves():
    sections = design_sections(DESIGN.read_text(encoding="utf-8"))
    problems = []
    for f in scanned_files():
        problems += check_text(f.read_text(encoding="utf-8"), f.relative_to(ROOT), sections=sections)
    assert not problems, "broken doc references:\n" + "\n".join(problems)


def test_the_code_cites_the_design_sections_it_implements():
    # the sections the code has always cited keep their meaning: KDA, MLA, MoE, serving, parallelism
    text = DESIGN.read_text(encoding="utf-8")
    titles = {h.split()[0].rstrip("."): h for h in headings(text) if h[0].isdigit()}
    assert "KDA" in titles["1.1"] and "MLA" in titles["1.2"] and "MoE" in titles["1.5"]
    assert "Serving" in titles["3"] and "Parallelism" in titles["5"]
    assert {"s1-1", "s1-5", "s3", "s5"} <= anchors_of(text)


# ---- the checker itself (made-up strings; split so that scanning this file finds nothing) -------------

_SECTIONS = {"1", "1.1", "1.5", "5"}


def _check(text: str, source: str = "longmoe/x.py") -> list[str]:
    return check_text(text, Path(source), sections=_SECTIONS)


def test_checker_accepts_existing_sections_and_anchors():
    assert _check("Sparse MoE (docs/design" + ".md §1.5) and (docs/design" + ".md §1.1, §5).") == []
    assert _check("see docs/" + "moe.md#targets-and-honest-notes") == []
    assert _check("see [the layer](docs/" + "moe.md#the-layer)", "README.md") == []


def test_checker_rejects_a_missing_section():
    problems = _check("KDA (docs/design" + ".md §9.9)")
    assert len(problems) == 1 and "§9.9" in problems[0] and "x.py:1" in problems[0]
    assert len(_check("docs/design" + ".md §1.1, §1.7")) == 1  # the second of a list


def test_checker_rejects_the_short_form_without_the_file_name():
    assert any("cite the file" in p for p in _check("Not implemented (design " + "§5)"))


def test_checker_wants_the_docs_path_outside_docs():
    assert any("outside docs/" in p for p in _check("MoE (design" + ".md §1.5)"))
    assert _check("MoE (design" + ".md §1.5)", "docs/moe.md") == []


def test_checker_rejects_a_missing_file_or_anchor():
    assert any("no such file" in p for p in _check("docs/" + "no_such_page.md"))
    assert any("#no-such-heading" in p for p in _check("docs/" + "kda.md#no-such-heading"))
    assert any("#nope" in p for p in _check("[x](" + "kda.md#nope)", "docs/model.md"))
    assert _check("`[x](" + "kda.md#nope)` is code", "docs/model.md") == []


def test_github_slug_matches_githubs_rule():
    assert github_slug("Targets and honest notes") == "targets-and-honest-notes"
    assert github_slug("1.5 Sparse MoE in a latent space") == "15-sparse-moe-in-a-latent-space"
    assert github_slug("Dispatch: gather + tiered padded `bmm`") == "dispatch-gather--tiered-padded-bmm"
    assert github_slug("Layout — `parallel_dims.py`") == "layout--parallel_dimspy"
    assert anchors_of('# A\n## A\n```\n# not a heading\n```\n<a id="s1-1"></a>') == {"a", "a-1", "s1-1"}
