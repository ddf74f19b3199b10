"""Confidence intervals for a family's pooled field F1: a page-level bootstrap, and a Clopper-Pearson
bound where the bootstrap is degenerate.

A jackknife standard error of ``0.000`` at F1 1.000 says nothing about how far below 1 the true F1
could be: when every page is right, every resample is too. So the reported interval is

- the **percentile bootstrap** over pages (``n_boot`` resamples of the family's pages with
  replacement, pooled micro F1 of each, the 2.5th and 97.5th percentiles), and
- when **every page scores F1 0 or 1** (all-or-nothing pages, where the bootstrap collapses at the
  boundary once all pages agree): the union of that interval with the exact **Clopper-Pearson**
  interval of the page-level success rate (``k`` of ``n`` pages with F1 1). With ``k = n`` its lower
  end is ``(α/2)^(1/n)`` (0.982 at n = 200, the two-sided "rule of three"), with ``k = 0`` its upper
  end is ``1 - (α/2)^(1/n)``; so F1 1.000 on 200 pages reads ``[0.982, 1.000]``, never ``± 0``.

Pure functions; the resampling is seeded, so a summary is reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

LEVEL = 0.95
N_BOOT = 2000


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n up to many thousands)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]  # fmt: skip
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


def _bisect(f: Callable[[float], float], lo: float, hi: float, iters: int = 60) -> float:
    """The root of ``f`` (decreasing in p) on ``[lo, hi]``."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The exact (conservative) two-sided interval of a binomial proportion, ``k`` successes of ``n``."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"k={k}, n={n} is invalid: expected 0 <= k <= n and n >= 1")
    a = (1 - level) / 2
    lo = 0.0 if k == 0 else _bisect(lambda p: a - (1 - _binom_cdf(k - 1, n, p)), 0.0, 1.0)
    hi = 1.0 if k == n else _bisect(lambda p: _binom_cdf(k, n, p) - a, 0.0, 1.0)
    return lo, hi


def _f1(tp: np.ndarray, npred: np.ndarray, ngold: np.ndarray) -> np.ndarray:
    p = np.divide(tp, npred, out=np.zeros_like(tp), where=npred > 0)
    r = np.divide(tp, ngold, out=np.zeros_like(tp), where=ngold > 0)
    return np.divide(2 * p * r, p + r, out=np.zeros_like(tp), where=(p + r) > 0)


def bootstrap_f1(
    rows: list[dict[str, Any]], n_boot: int = N_BOOT, level: float = LEVEL, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval of the pooled (micro) field F1, resampling pages."""
    tp, npred, ngold = (np.array([float(r[k]) for r in rows]) for k in ("tp", "n_pred", "n_gold"))
    idx = np.random.default_rng(seed).integers(0, len(rows), size=(n_boot, len(rows)))  # [B, n]
    f = _f1(tp[idx].sum(1), npred[idx].sum(1), ngold[idx].sum(1))  # [B]
    a = (1 - level) / 2
    return float(np.quantile(f, a)), float(np.quantile(f, 1 - a))


def f1_interval(rows: list[dict[str, Any]], level: float = LEVEL, n_boot: int = N_BOOT) -> dict[str, Any]:
    """``micro_f1_lo``, ``micro_f1_hi`` and ``micro_f1_interval`` (the method) for a family's page rows."""
    if not rows:
        return {"micro_f1_lo": float("nan"), "micro_f1_hi": float("nan"), "micro_f1_interval": "none"}
    lo, hi = bootstrap_f1(rows, n_boot, level)
    method = "bootstrap"
    f1s = [float(r["f1"]) for r in rows]
    if all(f in (0.0, 1.0) for f in f1s):
        cp_lo, cp_hi = clopper_pearson(sum(f == 1.0 for f in f1s), len(rows), level)
        lo, hi, method = min(lo, cp_lo), max(hi, cp_hi), "bootstrap+clopper-pearson"
    return {"micro_f1_lo": lo, "micro_f1_hi": hi, "micro_f1_interval": method}
