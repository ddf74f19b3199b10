"""Reading ``/metrics`` in tests with ``prometheus_client``'s own parser (so a test reads the text
exactly as a Prometheus server would, labels and all)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition: ``(name, frozenset(labels.items())) -> value``."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def scrape(url: str, headers: dict | None = None) -> dict[tuple[str, frozenset], float]:
    r = httpx.get(url + "/metrics", headers=headers or {}, timeout=30)
    r.raise_for_status()
    return samples(r.text)


def value(found: dict[tuple[str, frozenset], float], name: str, **labels: str) -> float:
    """The value of the one sample named ``name`` whose labels include ``labels``."""
    hits = [v for (n, ls), v in found.items() if n == name and set(labels.items()) <= ls]
    if len(hits) != 1:
        raise KeyError(f"{name}{labels}: {len(hits)} samples")
    return hits[0]


def by_name(found: dict[tuple[str, frozenset], float], model: str = "tiny") -> dict[str, float]:
    """The series whose only label is ``model_name``, by name without the ``longmoe_`` prefix."""
    only = frozenset({("model_name", model)})
    return {n.removeprefix("longmoe_"): v for (n, ls), v in found.items() if ls == only}
