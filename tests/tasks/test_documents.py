"""Rendered documents (longmoe.tasks.documents): determinism, truth matches what is drawn, held-out
seeds disjoint from training seeds, sizes within limits, form_easy's grid alignment."""

from __future__ import annotations

import json

import numpy as np
import pytest

from longmoe.tasks import TaskError
from longmoe.tasks.documents import (
    FAMILIES,
    HELD_OUT_SEED_BASE,
    MAX_SIDE,
    canonical_json,
    held_out_seeds,
    parse_families,
    render,
    train_seeds,
)
from longmoe.tasks.documents.draw import ALNUM, bitmap_font, rotate_point
from longmoe.tasks.documents.forms import EASY_CELL, EASY_LABELS, EASY_VALUE_COL, easy_cell_origin


def _leaves(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}.{i}")
    else:
        yield prefix, obj


@pytest.mark.parametrize("family", list(FAMILIES))
def test_same_seed_same_pixels_and_truth(family):
    a, b = render(family, 7), render(family, 7)
    assert a.target == b.target and a.text == b.text
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image))
    c = render(family, 8)
    assert not np.array_equal(np.asarray(a.image), np.asarray(c.image)) or a.target != c.target


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_value_is_drawn_inside_the_page(family):
    for seed in range(12):
        d = render(family, seed)
        w, h = d.image.size
        assert d.image.mode == "RGB" and 8 <= w <= MAX_SIDE and 8 <= h <= MAX_SIDE
        leaves = dict(_leaves(d.fields))
        boxes = {b.path: b for b in d.boxes}
        assert set(leaves) == set(boxes), (family, seed)  # one drawn box per ground-truth leaf, no more
        for path, value in leaves.items():
            b = boxes[path]
            assert b.text == str(value)
            x0, y0, x1, y1 = b.box
            assert 0 <= x0 < x1 <= w and -2 <= y0 < y1 <= h, (family, seed, path, b.box)
            if family == "form_easy":  # clean page: the value's ink is in its box
                ink = np.asarray(d.image.convert("L"))[y0:y1, x0:x1] < 128
                assert ink.any(axis=0).sum() >= 3 * len(str(value)), (seed, path)
                assert f": {value}" in d.text


def test_truth_counts_and_consistency():
    for seed in range(20):
        e = render("form_easy", seed)
        assert 2 <= len(e.fields) <= 4
        assert list(e.fields) == sorted(e.fields)  # drawn top to bottom in key order
        assert all(k in EASY_LABELS and 3 <= len(v) <= 5 and set(v) <= set(ALNUM)
                   for k, v in e.fields.items())  # fmt: skip
        r = render("receipt", seed).fields
        cents = sum(int(it["price"].replace(".", "")) for it in r["items"])
        assert int(r["total"].replace(".", "")) == cents and 2 <= len(r["items"]) <= 5
        t = render("table", seed).fields["rows"]
        assert 2 <= len(t) <= 4 and len({tuple(sorted(row)) for row in t}) == 1
        f = render("figure_page", seed).fields["figure"]
        assert f["kind"] in ("bar", "line") and 2 <= f["count"] <= 6


def test_form_easy_glyphs_sit_whole_in_their_patch():
    """Each character's ink lies inside its 8x8 cell, so one patch holds exactly one glyph."""
    d = render("form_easy", 3)
    ink = np.asarray(d.image.convert("L")) < 128  # [H, W]
    lines = d.text.split("\n")
    for row, line in enumerate(lines):
        label, value = line.split(": ")
        cells = {c: ch for c, ch in enumerate(label + ":")}
        cells.update({EASY_VALUE_COL + j: ch for j, ch in enumerate(value)})
        for col in range(ink.shape[1] // EASY_CELL):
            patch = ink[row * EASY_CELL : (row + 1) * EASY_CELL, col * EASY_CELL : (col + 1) * EASY_CELL]
            assert patch.any() == (col in cells), (row, col)
    assert ink.shape == (len(lines) * EASY_CELL, 11 * EASY_CELL)  # one patch row per field


@pytest.mark.parametrize("family", list(FAMILIES))
def test_glyph_centres_lie_on_the_ink_of_their_characters(family):
    """Every recorded glyph centre has ink within 3 px on the finished page (rotation included), and
    the glyphs spell every ground-truth value: they are where a reader must look."""
    for seed in range(3):
        d = render(family, seed)
        ink = np.asarray(d.image.convert("L")) < 200  # [H, W] (a full stop at 10 px is a faint grey)
        H, W = ink.shape
        for g in d.glyphs:
            x, y = round(g.x), round(g.y)
            win = ink[max(0, y - 3) : min(H, y + 4), max(0, x - 3) : min(W, x + 4)]
            assert win.any(), (family, seed, g)
        chars = "".join(g.char for g in d.glyphs)
        for path, v in _leaves(d.fields):
            if path in ("figure.count", "figure.kind"):
                continue  # drawn as a chart, not as text
            for ch in str(v).replace(" ", ""):
                assert ch in chars, (family, seed, v)


def test_glyph_centres_turn_with_the_page():
    """Centres follow Image.rotate's rule (a pixel and its rotated place); form_easy's centres sit in
    the 8-px cell of their character, one per drawn character."""
    d = render("form_easy", 3)
    lines = d.text.split("\n")
    for g in d.glyphs:
        row, col = int(g.y // EASY_CELL), int(g.x // EASY_CELL)
        label, value = lines[row].split(": ")
        cells = {c: ch for c, ch in enumerate(label + ":")}
        cells.update({EASY_VALUE_COL + j: ch for j, ch in enumerate(value)})
        assert cells[col] == g.char, g
    assert len(d.glyphs) == sum(len(line.replace(" ", "")) for line in lines)
    from PIL import Image

    im = Image.new("L", (21, 21), 255)
    im.putpixel((10, 0), 0)  # a quarter turn anticlockwise takes the top-centre pixel to the left-centre
    ((y, x),) = np.argwhere(np.asarray(im.rotate(90, fillcolor=255)) < 128)
    assert rotate_point(10.5, 0.5, 90.0, 21, 21) == pytest.approx((x + 0.5, y + 0.5))  # pixel centres


def test_a_document_knows_the_angle_its_page_was_turned_by():
    """``Document.rotation``: 0 for families drawn straight, within the family's bound (3 degrees for
    receipts) and different from page to page otherwise."""
    assert all(render(f, s).rotation == 0.0 for f in ("form_easy", "form") for s in range(5))
    angles = [render("receipt", s).rotation for s in range(30)]
    assert all(abs(a) <= 3.0 for a in angles) and len({round(a, 3) for a in angles}) > 20


def test_form_easy_glyphs_are_whole_and_distinct_patches():
    """Every character form_easy draws stays inside its cell, and a linear projector can tell the
    characters apart (their patches differ)."""
    from PIL import Image, ImageDraw

    seen = {}
    for ch in sorted(set(ALNUM + ":" + "".join(EASY_LABELS))):
        im = Image.new("L", (3 * EASY_CELL, 3 * EASY_CELL), 255)  # the glyph's cell and its neighbours
        ImageDraw.Draw(im).text(easy_cell_origin(1, 1), ch, font=bitmap_font(), fill=0)
        ink = np.asarray(im) < 128
        cell = ink[EASY_CELL : 2 * EASY_CELL, EASY_CELL : 2 * EASY_CELL]
        assert cell.sum() == ink.sum() > 0, f"{ch!r} spills out of its cell"
        key = cell.tobytes()
        assert key not in seen, (ch, seen.get(key))
        seen[key] = ch


def test_held_out_seeds_are_disjoint_from_training():
    tr, ho = train_seeds(1000), held_out_seeds(1000)
    assert max(tr) < HELD_OUT_SEED_BASE <= min(ho) and not set(tr) & set(ho)
    assert render("form_easy", ho[0]).held_out and not render("form_easy", tr[0]).held_out
    with pytest.raises(TaskError, match="held-out range"):
        train_seeds(10, start=HELD_OUT_SEED_BASE - 5)
    assert set(held_out_seeds(5, offset=5)).isdisjoint(held_out_seeds(5))


def test_canonical_json_and_errors():
    assert canonical_json({"b": 1, "a": {"d": "x", "c": [1, 2]}}) == '{"a":{"c":[1,2],"d":"x"},"b":1}'
    d = render("receipt", 1)
    assert json.loads(d.target) == d.fields and canonical_json(json.loads(d.target)) == d.target
    assert parse_families("form_easy, table") == ["form_easy", "table"]
    assert parse_families(None) == list(FAMILIES)
    with pytest.raises(TaskError, match="unknown document family 'forms'"):
        parse_families("forms")
    with pytest.raises(TaskError, match="unknown document family"):
        render("nope", 0)
    with pytest.raises(TaskError, match="seed=-1"):
        render("form", -1)


def test_form_varied_layout_varies_off_the_patch_grid():
    """form_varied keeps form_easy's content but not its layout: the value's offset within its 8-px
    patch, the row pitch, the page size and the font differ across seeds."""
    offsets, pitches, sizes, heights, angles_or_noise = set(), set(), set(), set(), set()
    for seed in range(40):
        d = render("form_varied", seed)
        assert 2 <= len(d.fields) <= 4 and list(d.fields) == sorted(d.fields)
        assert all(k in EASY_LABELS and 3 <= len(v) <= 5 and set(v) <= set(ALNUM)
                   for k, v in d.fields.items())  # fmt: skip
        assert d.text == "\n".join(f"{k}: {v}" for k, v in d.fields.items())
        b = [box.box for box in d.boxes]
        offsets.add((b[0][0] % EASY_CELL, b[0][1] % EASY_CELL))
        pitches.add(b[1][1] - b[0][1])
        sizes.add(d.image.size)
        heights.add(b[0][3] - b[0][1])  # the value's ink height: differs between the fonts
        angles_or_noise.add(np.asarray(d.image.convert("L")).std().round(1))
    assert len(offsets) >= 12, "glyph-to-patch alignment should vary"
    assert len(pitches) >= 4 and len(sizes) >= 20 and len(heights) >= 2
    assert len(angles_or_noise) >= 20
