"""Where the held-out errors are: each ground-truth field of an evaluated page, classified.

For every page in a run's ``eval/extract_results.jsonl`` the page is rendered again from its seed and
each JSON leaf (``harness.flatten``) is marked right (the prediction has the same path and value) or
wrong (another value, or the path missing), and tagged with what might make it hard:

- ``shared_patch``: two of the value's glyph centres (``Document.glyphs``, scaled as ``patchify``
  resized the page) fall in one patch, which must then say two characters and their order;
- ``long``: the value is at least ``LONG`` characters (names, stores, titles, captions);
- ``number``: the value is digits with ``.``, ``-``, ``:`` or ``/`` (prices, dates, quantities);
- ``rotated``: the page is turned by at least ``ROTATED_DEG`` degrees (``Document.rotation``; the
  families turn pages by up to 2 or 3 degrees);
- ``not_text``: the value is not drawn as glyphs (a figure's chart kind and bar/point count).

The tags overlap; the table gives, per family and tag, the wrong fields among the fields with the tag,
so a tag's error rate can be read against the family's. A diagnostic: the value's glyph run is found
as its first unused occurrence in the page's glyph string, which a repeated value can mislead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from longmoe.config import VisionConfig
from longmoe.data.images import patchify
from longmoe.eval.extract.harness import RESULTS_FILE, flatten, parse_answer
from longmoe.runlog import read_jsonl
from longmoe.tasks.documents import Document, Glyph, render

LONG = 10  # characters: a value this long is a "long field"
ROTATED_DEG = 1.5  # |page angle| from which a page counts as rotated
TAGS = ("shared_patch", "long", "number", "rotated", "not_text")
NUMBER = re.compile(r"^[0-9][0-9.\-:/]*$")


def _runs(doc: Document) -> dict[str, list[Glyph]]:
    """Each drawn value's glyph run (by JSON path), where its text is found in the glyph string."""
    chars = "".join(g.char for g in doc.glyphs)
    used: set[int] = set()
    runs = {}
    for b in doc.boxes:
        text = b.text.replace(" ", "")
        start = 0
        while text and (i := chars.find(text, start)) >= 0:
            if i not in used:
                used.add(i)
                runs[b.path] = doc.glyphs[i : i + len(text)]
                break
            start = i + 1
    return runs


def shares_patch(doc: Document, glyphs: list[Glyph], cfg: VisionConfig) -> bool:
    """Whether two of ``glyphs`` have their centres in one patch of the page as the model sees it."""
    p = patchify(doc.image, cfg)
    w, h = doc.image.size
    P = cfg.patch_size
    sx, sy = p.cols * P / w, p.rows * P / h
    cells = [(int(g.y * sy // P), int(g.x * sx // P)) for g in glyphs if g.char.strip()]
    return len(set(cells)) < len(cells)


def field_tags(doc: Document, cfg: VisionConfig) -> dict[str, set[str]]:
    """Each JSON leaf path of ``doc`` -> its tags (``TAGS``)."""
    runs = _runs(doc)
    rotated = abs(doc.rotation) >= ROTATED_DEG
    out: dict[str, set[str]] = {}
    for path, value in flatten(doc.fields).items():
        text = json.loads(value) if value.startswith('"') else value
        tags = set()
        if len(str(text)) >= LONG:
            tags.add("long")
        if NUMBER.match(str(text)):
            tags.add("number")
        if rotated:
            tags.add("rotated")
        if path not in runs:
            tags.add("not_text")
        elif shares_patch(doc, runs[path], cfg):
            tags.add("shared_patch")
        out[path] = tags
    return out


def classify(rows: Iterable[dict], cfg: VisionConfig) -> dict[str, dict]:
    """Per family: ``fields``, ``wrong``, ``wrong_untagged`` and, per tag, ``{"fields", "wrong"}``."""
    out: dict[str, dict] = {}
    for r in rows:
        doc = render(r["family"], r["seed"])
        pred = flatten(parse_answer(r["prediction"]) or {})
        c = out.setdefault(doc.family, {"pages": 0, "fields": 0, "wrong": 0, "wrong_untagged": 0,
                                        "tags": {t: {"fields": 0, "wrong": 0} for t in TAGS}})  # fmt: skip
        c["pages"] += 1
        gold = flatten(doc.fields)
        for path, tags in field_tags(doc, cfg).items():
            bad = pred.get(path) != gold[path]
            c["fields"] += 1
            c["wrong"] += bad
            c["wrong_untagged"] += bad and not tags
            for t in tags:
                c["tags"][t]["fields"] += 1
                c["tags"][t]["wrong"] += bad
    return out


def classify_run(run_dir: Path, cfg: VisionConfig) -> dict[str, dict]:
    """``classify`` over a model's held-out results (``run_dir/eval/extract_results.jsonl``)."""
    return classify(read_jsonl(run_dir / "eval" / RESULTS_FILE), cfg)


def error_table(errors: dict[str, dict]) -> str:
    """Markdown: per family, wrong fields of all and of each tag (``wrong / fields``)."""
    head = "| family | pages | wrong / fields | " + " | ".join(TAGS) + " | wrong with no tag |"
    lines = [head, "|---|---|---|" + "---|" * len(TAGS) + "---|"]
    for fam, c in errors.items():
        cells = [f"{c['tags'][t]['wrong']} / {c['tags'][t]['fields']}" for t in TAGS]
        lines.append(f"| {fam} | {c['pages']} | {c['wrong']} / {c['fields']} | " + " | ".join(cells)
                     + f" | {c['wrong_untagged']} |")  # fmt: skip
    return "\n".join(lines) + "\n"
