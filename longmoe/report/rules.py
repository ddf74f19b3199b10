"""A headline number and the rules a README headline keeps (docs/benchmarks.md, "Headline rules").

Enforced by ``violations`` for every README headline: it names the model and its size (``model``); it
is a pre-registered cell or the median over all cells with their range, never the best of N; losing rows
are kept; the peer runs at its strongest setting, named in the baseline; and it carries a range ([min,
max] over alternating rounds, for timings) or an interval (seeds / bootstrap / standard error, for
quality), ``noise_kind``. A number without one can be in the report card, never in the README.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Headline:
    """One number worth reading, with what it is read against and how noisy it is."""

    label: str
    value: str
    baseline: str
    noise: str
    readme: bool = False  # also in the README's headline table
    model: str = ""  # the model measured and its size, e.g. "~0.3B Kimi-Linear, random weights"
    noise_kind: str = ""  # "range" (timings over rounds), "interval" (quality), "exact"; "" = none recorded
    commit: str = (
        ""  # the commit that measured it, where a file merges runs of several commits ("": the file's)
    )


NOISE_KINDS = ("range", "interval", "exact")


def violations(h: Headline) -> list[str]:
    """The headline rules a README headline breaks (empty for a report-card-only one)."""
    if not h.readme:
        return []
    out = []
    if not h.model.strip():
        out.append("names no model and size")
    if h.noise_kind not in NOISE_KINDS:
        out.append("has no range or interval (a number without one is not a README headline)")
    return out
