"""Scoring a prediction against a task item's answers.

- ``exact``: the prediction's items (split at commas, semicolons, "and", newlines) are exactly the
  answers, as a set, after normalisation. Strict: nothing missing, nothing extra.
- ``all``: every answer occurs in the prediction as a whole word/number (RULER ``string_match_all``;
  word boundaries so that ``12`` does not count as containing ``2``).
- ``part``: the share of answers that occur (RULER ``string_match_part`` for one item).

Normalisation: lower case, punctuation other than ``-`` inside words removed, articles dropped,
whitespace collapsed. Only the first line of the prediction is scored (models are asked for the
answer right after ``Answer:``; what follows is rambling).
"""

from __future__ import annotations

import re
import string

_PUNCT = re.compile(f"[{re.escape(string.punctuation.replace('-', ''))}]")
_SPLIT = re.compile(r"\s*(?:,|;|\band\b|\n)\s*")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
METRICS = ("exact", "all", "part")


def normalize(s: str) -> str:
    s = _PUNCT.sub(" ", s.lower())
    s = re.sub(r"(?<!\w)-|-(?!\w)", " ", s)  # keep hyphens only inside words (crimson-otter)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_span(prediction: str) -> str:
    """The scored part of a completion: its first non-empty line."""
    for line in prediction.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def _items(s: str) -> list[str]:
    return [n for n in (normalize(x) for x in _SPLIT.split(s)) if n]


def exact_match(prediction: str, answers: list[str]) -> float:
    pred = answer_span(prediction)
    return float(sorted(_items(pred)) == sorted(normalize(a) for a in answers) and bool(answers))


def _contains(text: str, answer: str) -> bool:
    a = normalize(answer)
    return bool(a) and re.search(rf"(?<![\w-]){re.escape(a)}(?![\w-])", text) is not None


def contains_all(prediction: str, answers: list[str]) -> float:
    text = normalize(answer_span(prediction))
    return float(bool(answers) and all(_contains(text, a) for a in answers))


def contains_part(prediction: str, answers: list[str]) -> float:
    if not answers:
        return 0.0
    text = normalize(answer_span(prediction))
    return sum(_contains(text, a) for a in answers) / len(answers)


def score(prediction: str, answers: list[str]) -> dict[str, float]:
    """All metrics of one prediction (keys ``METRICS``)."""
    return {
        "exact": exact_match(prediction, answers),
        "all": contains_all(prediction, answers),
        "part": contains_part(prediction, answers),
    }
