"""The hard families: receipts, small tables, and pages with text around an embedded figure.

Each draws one font per page from ``varied_fonts()``, then rotates the page by up to a few degrees and
adds pixel noise (``draw.finish``). Ground truth holds only what is drawn: a receipt's total is the
sum of its drawn prices, a figure's bar count is the number of bars drawn.
"""

from __future__ import annotations

import random
from typing import Any

from longmoe.tasks.base import ADJECTIVES, NOUNS, PLACES
from longmoe.tasks.documents.draw import (
    INK,
    Box,
    Canvas,
    Page,
    code,
    finish,
    line_height,
    money,
    text_size,
    varied_fonts,
    wrap,
)

HARD_NOISE = (4.0, 14.0)  # pixel-noise standard deviation range (0..255 units)
HARD_DEGREES = 3.0  # rotation range (±)


def _finish_hard(canvas: Canvas, rng: random.Random) -> Any:
    return finish(canvas, rng, noise=rng.uniform(*HARD_NOISE), max_degrees=HARD_DEGREES)


# ---------------------------------------------------------------------- receipt
def receipt(rng: random.Random) -> Page:
    font = rng.choice(varied_fonts())
    lh = line_height(font) + rng.randint(0, 2)
    n_items = rng.randint(2, 5)
    store = f"{rng.choice(PLACES)} {rng.choice(('Market', 'Store', 'Deli', 'Bakery', 'Hardware'))}"
    date = f"{rng.randint(2015, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    names = rng.sample(NOUNS, n_items)
    prices = [money(rng, 0.5, 60) for _ in range(n_items)]
    total_cents = sum(int(p.replace(".", "")) for p in prices)
    total = f"{total_cents // 100}.{total_cents % 100:02d}"
    width = rng.choice((160, 192, 224))
    height = min(256, 12 + lh * (n_items + 5))
    canvas = Canvas(width, height)
    x0, x1 = rng.randint(4, 12), width - rng.randint(6, 14)  # left edge, right edge of prices
    y = rng.randint(3, 8)
    canvas.text((x0, y), store, font, path="store")
    y += lh
    canvas.text((x0, y), date, font, path="date")
    y += lh + 2
    items = []
    for i, (name, price) in enumerate(zip(names, prices)):
        canvas.text((x0, y), name, font, path=f"items.{i}.name")
        canvas.text((x1 - text_size(font, price)[0], y), price, font, path=f"items.{i}.price")
        items.append({"name": name, "price": price})
        y += lh
    canvas.draw.line((x0, y + 1, x1, y + 1), fill=INK)
    y += 4
    canvas.text((x0, y), "TOTAL", font)
    canvas.text((x1 - text_size(font, total)[0], y), total, font, path="total")
    fields = {"store": store, "date": date, "items": items, "total": total}
    text = "\n".join([store, date, *(f"{n} {p}" for n, p in zip(names, prices)), f"TOTAL {total}"])
    return _finish_hard(canvas, rng), fields, text, canvas.boxes, canvas.glyphs


# ---------------------------------------------------------------------- table
TABLE_COLUMNS = {  # header -> value generator
    "City": lambda r: r.choice(PLACES),
    "Item": lambda r: r.choice(NOUNS),
    "Qty": lambda r: str(r.randint(1, 250)),
    "Price": lambda r: money(r, 0.2, 99),
    "Code": lambda r: code(r, 3, 5),
    "Year": lambda r: str(r.randint(1990, 2030)),
    "Grade": lambda r: r.choice("ABCDEF"),
}


def table(rng: random.Random) -> Page:
    font = rng.choice(varied_fonts())
    headers = rng.sample(sorted(TABLE_COLUMNS), rng.randint(2, 3))
    n_rows = rng.randint(2, 4)
    cells = [[TABLE_COLUMNS[h](rng) for h in headers] for _ in range(n_rows)]
    pad = 4
    col_w = [max(text_size(font, s)[0] for s in [h] + [row[j] for row in cells]) + 2 * pad for j, h in
             enumerate(headers)]  # fmt: skip
    lh = line_height(font) + 2
    width = min(256, sum(col_w) + rng.randint(12, 40))
    height = min(256, lh * (n_rows + 1) + rng.randint(12, 40))
    canvas = Canvas(width, height)
    x_start, y_start = rng.randint(4, 10), rng.randint(4, 10)
    xs = [x_start]
    for w in col_w:
        xs.append(xs[-1] + w)
    ys = [y_start + i * lh for i in range(n_rows + 2)]
    for x in xs:  # grid lines
        canvas.draw.line((x, ys[0], x, ys[-1]), fill=INK)
    for yy in ys:
        canvas.draw.line((xs[0], yy, xs[-1], yy), fill=INK)
    for j, h in enumerate(headers):
        canvas.text((xs[j] + pad, ys[0] + 2), h, font)
    rows = []
    for i, row in enumerate(cells):
        rec = {}
        for j, (h, v) in enumerate(zip(headers, row)):
            canvas.text((xs[j] + pad, ys[i + 1] + 2), v, font, path=f"rows.{i}.{h.lower()}")
            rec[h.lower()] = v
        rows.append(rec)
    text = "\n".join([" | ".join(headers)] + [" | ".join(r) for r in cells])
    return _finish_hard(canvas, rng), {"rows": rows}, text, canvas.boxes, canvas.glyphs


# ---------------------------------------------------------------------- figure page
FIGURE_KINDS = ("bar", "line")


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(ADJECTIVES if i % 2 == 0 else NOUNS) for i in range(n)]
    return " ".join(words).capitalize() + "."


def figure_page(rng: random.Random) -> Page:
    font = rng.choice(varied_fonts())
    lh = line_height(font)
    width, height = 256, rng.choice((192, 224, 256))
    canvas = Canvas(width, height)
    margin = rng.randint(6, 14)
    body_w = width - 2 * margin
    title = f"{rng.choice(ADJECTIVES).capitalize()} {rng.choice(NOUNS)} report"
    y = rng.randint(4, 8)
    canvas.text((margin, y), title, font, path="title")
    y += lh + 4
    before = wrap(_sentence(rng, rng.randint(6, 12)), font, body_w)[:2]
    for line in before:
        canvas.text((margin, y), line, font)
        y += lh
    # the figure: a framed plot of `count` bars or line points
    kind, count = rng.choice(FIGURE_KINDS), rng.randint(2, 6)
    fig_h = rng.randint(56, 72)
    fx0, fy0 = margin + rng.randint(0, 40), y + 4
    fx1, fy1 = min(width - margin, fx0 + rng.randint(120, 170)), fy0 + fig_h
    canvas.draw.rectangle((fx0, fy0, fx1, fy1), outline=INK)
    slot = (fx1 - fx0 - 8) / count
    heights = [rng.randint(8, fig_h - 10) for _ in range(count)]
    pts = []
    for i, bh in enumerate(heights):
        cx = fx0 + 4 + slot * (i + 0.5)
        if kind == "bar":
            canvas.draw.rectangle(
                (cx - slot * 0.3, fy1 - 2 - bh, cx + slot * 0.3, fy1 - 2), fill=(90, 90, 90)
            )
        else:
            pts.append((cx, fy1 - 2 - bh))
    if pts:
        canvas.draw.line(pts, fill=INK, width=1)
        for px, py in pts:
            canvas.draw.ellipse((px - 2, py - 2, px + 2, py + 2), fill=INK)
    canvas.boxes.append(Box("figure.count", str(count), (fx0, fy0, fx1, fy1)))
    canvas.boxes.append(Box("figure.kind", kind, (fx0, fy0, fx1, fy1)))
    y = fy1 + 3
    number = rng.randint(1, 9)
    caption = f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} by {rng.choice(('year', 'site', 'batch'))}"
    label = f"Figure {number}: "
    x_cap = canvas.text((margin, y), label, font)[0]
    canvas.boxes.append(Box("figure.number", str(number), (margin, y, x_cap, y + lh)))
    if not canvas.fits(x_cap, y, caption, font):
        caption = caption.split(" by ")[0]
    canvas.text((x_cap, y), caption, font, path="figure.caption")
    y += lh + 2
    after = []
    for line in wrap(_sentence(rng, rng.randint(8, 16)), font, body_w):
        if y + lh > height - 2:
            break
        canvas.text((margin, y), line, font)
        after.append(line)
        y += lh
    fields = {"title": title, "figure": {"caption": caption, "count": count, "kind": kind, "number": number}}
    text = "\n".join(
        [title, *before, f"[{kind} chart with {count} {'bars' if kind == 'bar' else 'points'}]",
         f"{label}{caption}", *after]
    )  # fmt: skip
    return _finish_hard(canvas, rng), fields, text, canvas.boxes, canvas.glyphs
