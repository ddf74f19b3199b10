"""Cross-document conflict resolution: reports disagree; the question states which one wins.

Several dated reports from different sources give different values for the same fact (plus a report
about another place, to force matching the entity). ``latest``: the report with the latest date wins
(dates are not in reading order). ``authority``: one named source is authoritative; it is never the
latest report, so the two rules disagree and only following the stated rule gives the answer.
The winning report sits at ``depth``; the others anywhere.
"""

from __future__ import annotations

import random

from longmoe.tasks.base import PLACES, SHORT_LENGTH, Spec, distinct, number

VARIANTS = ("latest", "authority")
MIN_REPORTS, MAX_REPORTS = 3, 5  # 2-3 when short
ATTRIBUTES = (
    "population",
    "number of registered ships",
    "annual rainfall in millimetres",
    "number of public wells",
    "height of the old lighthouse in centimetres",
)
SOURCES = (
    "Harbor Gazette",
    "Provincial Census Office",
    "Northern Almanac",
    "Royal Survey Bureau",
    "Merchant Guild Ledger",
    "Weekly Courier",
    "University Geography Department",
    "Travelers' Handbook",
)

_REPORT = "Report from the {source}, dated {date}: the {attribute} of {place} is {value}."


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1995, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def make_spec(rng: random.Random, variant: str, depth: float, length: int) -> Spec:
    short = length < SHORT_LENGTH
    if variant not in VARIANTS:
        raise ValueError(f"conflict variant {variant!r} is unknown: expected one of {VARIANTS}")
    k = rng.randint(2, 3) if short else rng.randint(MIN_REPORTS, MAX_REPORTS)
    place, other_place = rng.sample(PLACES, 2)
    attribute = rng.choice(ATTRIBUTES)
    values = distinct(rng, k + 1, lambda r: number(r, 6))
    dates = sorted(distinct(rng, k + 1, _date))
    sources = rng.sample(SOURCES, k + 1)
    latest = k - 1  # reports 0..k-1 are about `place`, sorted by date; k is the other place
    if variant == "latest":
        winner = latest
        q = (
            f"The reports in the text disagree about the {attribute} of {place}. The most recent report "
            f"is correct. What is the {attribute} of {place}?"
        )
    else:
        winner = rng.randrange(k - 1)  # any report but the latest one
        q = (
            f"The reports in the text disagree about the {attribute} of {place}. Only the {sources[winner]} "
            f"is authoritative; ignore every other source. What is the {attribute} of {place}?"
        )
    reports = [
        {"source": sources[i], "date": dates[i], "value": values[i], "place": place if i < k else other_place}
        for i in range(k + 1)
    ]
    order = list(range(k + 1))
    rng.shuffle(order)
    pos = {i: rng.random() for i in order}
    pos[winner] = depth
    needles = [(pos[i], _REPORT.format(attribute=attribute, **reports[i])) for i in order]
    meta = {
        "n_conflicts": k,
        "rule": variant,
        "authority": sources[winner] if variant == "authority" else None,
        "reports": reports,
        "attribute": attribute,
        "place": place,
    }
    return Spec(needles, q, [values[winner]], meta, forbidden=values)
