"""The issue's expectations for MQAR, checked against the best run per cell, with their noise.

The noise of an accuracy measured on ``n`` answers is its binomial standard error
``sqrt(p (1 - p) / n)``; with several seeds the report also shows their spread. Accuracies are the
test rows' (``seeds``), never the rows early stopping and the lr choice used. The baseline of every
accuracy is chance among the row's values, ``1 / P`` (a model that has found the value region but not
the pair), not ``1 / vocab``.
"""

from __future__ import annotations

import math

from longmoe.pipelines.mqar.config import SweepConfig
from longmoe.pipelines.mqar.result import Check, RunResult

HYBRIDS = ("LM", "LLLM")


LEARNT = 0.5  # accuracy at the training length below which a cell has no recall to extrapolate


def answers(rc: SweepConfig, n_pairs: int) -> int:
    """Answers behind one accuracy number: every held-out row asks all of its pairs."""
    return rc.eval_n * n_pairs


def chance(n_pairs: int) -> float:
    """Accuracy of a guess among the row's ``P`` in-context values."""
    return 1 / n_pairs


def se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n) if n else math.nan


def _cells(runs: list[RunResult], pattern: str, position: str = "none") -> list[RunResult]:
    return sorted(
        (r for r in runs if r.cell.pattern == pattern and r.cell.position == position),
        key=lambda r: (r.cell.n_pairs, r.cell.d_model, r.cell.seed),
    )


def _describe(rc: SweepConfig, rs: list[RunResult], length: int) -> str:
    return "; ".join(
        f"d{r.cell.d_model} p{r.cell.n_pairs} s{r.cell.seed}: {r.acc(length):.3f} "
        f"± {se(r.acc(length), answers(rc, r.cell.n_pairs)):.3f}"
        for r in rs
    )


def _all_solved(claim: str, rc: SweepConfig, rs: list[RunResult], length: int) -> Check:
    if not rs:
        return Check(claim, "not measured", "no runs")
    ok = all(r.acc(length) >= rc.target_accuracy for r in rs)
    return Check(claim, "confirmed" if ok else "not confirmed", _describe(rc, rs, length))


def expected_checks(rc: SweepConfig, best: list[RunResult]) -> list[Check]:
    """Pure MLA solves every cell; pure KDA falls as pairs grow; the hybrids solve every cell; the
    NoPE control; and recall past the training length."""
    T, t = rc.train_len, rc.target_accuracy
    out = [
        _all_solved(f"pure MLA (M) reaches >= {t} at every width and pair count", rc, _cells(best, "M"), T)
    ]
    kda = _cells(best, "L")
    if kda:
        lo, hi = min(r.cell.n_pairs for r in kda), max(r.cell.n_pairs for r in kda)
        small = [r for r in kda if r.cell.n_pairs == lo]
        large = [r for r in kda if r.cell.n_pairs == hi]
        falls = all(r.acc(T) >= t for r in small) and any(r.acc(T) < t for r in large)
        out.append(
            Check(
                f"pure KDA (L) solves few pairs ({lo}) and falls below {t} with many ({hi})",
                "confirmed" if falls else "not confirmed",
                _describe(rc, kda, T),
            )
        )
    for h in HYBRIDS:
        if h in rc.patterns:
            out.append(
                _all_solved(
                    f"hybrid {h} reaches >= {t} at every width and pair count", rc, _cells(best, h), T
                )
            )
    m, mc = _cells(best, "M"), _cells(best, "M", "conv")
    plain = {(r.cell.d_model, r.cell.n_pairs, r.cell.seed): r for r in m}
    pairs = [(plain[k], r) for r in mc if (k := (r.cell.d_model, r.cell.n_pairs, r.cell.seed)) in plain]
    if pairs:
        gain = sum(c.acc(T) - p.acc(T) for p, c in pairs) / len(pairs)
        fixed = all(c.acc(T) >= t for _, c in pairs) and any(p.acc(T) < t for p, _ in pairs)
        verdict = (
            "confirmed: NoPE MLA needs a local position signal, not more state" if fixed else "not confirmed"
        )
        out.append(
            Check(
                "the NoPE control: a short causal conv before MLA (no extra state) fixes pure MLA",
                verdict,
                f"mean accuracy gain over the same cells without it {gain:+.3f}; M+conv: "
                + _describe(rc, [c for _, c in pairs], T),
            )
        )
    for p in rc.patterns:
        for pos in rc.positions:
            rs = _cells(best, p, pos)  # solved or not: an unsolved cell's recall can still fall with length
            if not rs:
                continue
            unsolved = [r for r in rs if r.acc(T) < t]
            for m_ in rc.eval_multiples[1:]:
                n = T * m_
                holds = all(
                    r.acc(n) >= r.acc(T) - 2 * se(r.acc(T), answers(rc, r.cell.n_pairs)) - 0.05 for r in rs
                )
                tag = "" if pos == "none" else f"+{pos}"
                note = (
                    f" ({len(unsolved)} of {len(rs)} cells below {t} at {T} tokens, included)"
                    if unsolved
                    else ""
                )
                verdict = "confirmed" if holds else "not confirmed"
                if all(r.acc(T) < LEARNT for r in rs):  # no recall learnt at T: nothing to keep
                    verdict = f"not measurable: no cell recalls {LEARNT:.0%} of the answers at {T} tokens"
                out.append(
                    Check(
                        f"{p}{tag} keeps its recall at {m_}x the training length ({n} tokens; within 0.05)",
                        verdict,
                        _describe(rc, rs, n) + note,
                    )
                )
    return out
