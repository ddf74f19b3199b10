"""The ablation's expected outcomes, checked against the measured numbers, with a noise margin."""

from __future__ import annotations

import math

from longmoe.pipelines.longctx_tiny.config import RecipeConfig
from longmoe.pipelines.longctx_tiny.result import Check, EvalResult


def fmt(x: float | None, nd: int = 2) -> str:
    """A number for a table cell; ``-`` for missing or NaN."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def two_se(a: tuple[float, int], b: tuple[float, int]) -> float:
    """Two standard errors of the difference of two accuracies measured on ``n`` items each."""
    (pa, na), (pb, nb) = a, b
    if not na or not nb:
        return math.nan
    return 2 * math.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb)


def check(claim: str, a: float, b: float, higher_is_better: bool, noise: float | None = None) -> Check:
    """Verdict on ``a`` vs ``b``; with ``noise`` (two standard errors of ``a - b``), a smaller gap is
    reported as within noise rather than as a confirmation or a refutation."""
    evidence = f"{fmt(a, 3)} vs {fmt(b, 3)}"
    if noise is not None and noise == noise and noise > 0:
        evidence += f", 2 SE {fmt(noise, 3)}"
    if a != a or b != b:
        verdict = "not measured"
    elif a == b:
        verdict = "not shown (tie)"
    elif noise is not None and noise == noise and abs(a - b) <= noise:
        verdict = "within noise: " + ("leans yes" if (a > b) == higher_is_better else "leans no")
    else:
        verdict = "confirmed" if (a > b) == higher_is_better else "not confirmed"
    return Check(claim, verdict, evidence, a, b)


def expected_checks(rc: RecipeConfig, evals: dict[str, EvalResult]) -> list[Check]:
    """The issue's expectations, as measured: hybrid > pure KDA on multi-key retrieval; hybrid > pure
    MLA past the training length (task accuracy and loss)."""
    out = []
    lengths, beyond = rc.eval_lengths, rc.beyond_lengths
    h, l_, m = rc.reference_pattern, "L", "M"
    if h in evals and l_ in evals:
        a = evals[h].variant_accuracy("niah", "multikey", lengths)
        b = evals[l_].variant_accuracy("niah", "multikey", lengths)
        claim = f"{h} beats {l_} on multi-key retrieval (niah multikey, all lengths)"
        out.append(check(claim, a[0], b[0], True, noise=two_se(a, b)))
        na, nb = (evals[p].answer_loss("niah", "multikey", lengths) for p in (h, l_))
        out.append(check(f"{h} has lower multi-key answer loss than {l_} (all lengths)", na, nb, False))
    if h in evals and m in evals and beyond:
        a, b = (evals[p].pooled_accuracy(rc.eval_tasks, beyond) for p in (h, m))
        claim = f"{h} beats {m} on task accuracy past the training window"
        out.append(check(claim, a[0], b[0], True, noise=two_se(a, b)))
        na, nb = (
            sum(evals[p].answer_loss(t, "*", beyond) for t in rc.eval_tasks) / len(rc.eval_tasks)
            for p in (h, m)
        )
        out.append(check(f"{h} has lower answer loss than {m} past the training window", na, nb, False))
        out.append(
            check(
                f"{h} has lower loss than {m} past the training window",
                evals[h].ppl["beyond"],
                evals[m].ppl["beyond"],
                False,
            )
        )
    return out
