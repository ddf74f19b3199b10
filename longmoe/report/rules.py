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

# the honest noise of a number the file holds once (written before its script ran rounds)
ONE_SAMPLE = "one sample (no rounds recorded)"


def x_ratio(a: float) -> str:
    """A ratio as headlines print it: 2.25×, 14.9×."""
    return f"{a:.2f}×" if a < 10 else f"{a:.1f}×"


def round_range(
    d: dict, s: dict | None, what: str = "per-round speed-ups", fallback: str = ONE_SAMPLE, spec: str = ".2f",
    over: str = "",
) -> dict:  # fmt: skip
    """A headline's noise (``Headline`` keywords): ``what`` [min, max] of the spread ``s`` (a
    ``bench.common.spread``) over the file ``d``'s ``n_rounds`` alternating rounds, or ``fallback`` where
    the file has no rounds (``s`` empty)."""
    if not s:
        return {"noise": fallback}
    return {
        "noise": f"{what} [{s['min']:{spec}}, {s['max']:{spec}}]{over} ({d['n_rounds']} alternating rounds)",
        "noise_kind": "range",
    }


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
