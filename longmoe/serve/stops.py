"""Stop strings over a growing text, at a cost bounded by the stop strings, not the text.

``find_stop`` looks for a match only where a new one can be (it must end in the new characters);
``safe_end`` holds back a suffix that could still grow into a stop string, so streamed text never
shows the start of a stop string that is then cut.
"""

from __future__ import annotations


def find_stop(text: str, stops: list[str], n_new: int) -> int | None:
    """Where the earliest stop string in ``text`` starts, given that the text before its last
    ``n_new`` characters held none: only a match ending in the new text is possible, so only the last
    ``n_new + max_stop_len - 1`` characters are searched."""
    start = max(0, len(text) - n_new - max(len(s) for s in stops) + 1)
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def safe_end(text: str, stops: list[str], sent: int) -> int:
    """How much of ``text`` can be shown: not a suffix that could still grow into a stop string.

    The held suffix is at most ``len(stop) - 1`` characters and never reaches back before ``sent``
    (text already shown), so the work is bounded by the stop strings' lengths, not the text's."""
    end = len(text)
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, end - sent), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return end - hold
