"""The output processor: a request's text, token by token (incremental detokenising, stop strings).

As vLLM v1's output processor, it lives outside the request record and the model runner: the
scheduler's ``update`` hands it each recorded token with the runner's finish (if any) and gets back
the final finish reason and the text delta that is safe to send. Per token the work is bounded, not
proportional to the output so far: the detokeniser decodes a small window of recent ids
(``serve/detok.py``) and stop strings are searched only where a new match can be (``serve/stops.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from longmoe.serve.detok import IncrementalDetokenizer, _Decodes
from longmoe.serve.stops import find_stop, safe_end


@dataclass
class TextState:
    """One request's text so far and how much of it was sent."""

    detok: IncrementalDetokenizer | None
    text: str = ""
    sent: int = 0  # characters of ``text`` already emitted


class OutputProcessor:
    """Texts of the requests in flight, by request id (engine thread only)."""

    def __init__(self, tokenizer: _Decodes | None) -> None:
        """``tokenizer`` None: no text (the scheduler's model-free tests)."""
        self.tokenizer = tokenizer
        self.texts: dict[int, TextState] = {}

    def _state(self, rid: int) -> TextState:
        st = self.texts.get(rid)
        if st is None:
            tok = self.tokenizer
            st = self.texts[rid] = TextState(None if tok is None else IncrementalDetokenizer(tok))
        return st

    def process(self, rid: int, token: int, stop: list[str], finish: str | None) -> tuple[str | None, str]:
        """Add ``token`` (``finish``: the runner's, see ``step.RUNNER_FINISHES``); returns the request's
        finish reason (None: it goes on) and the text delta to send."""
        st = self._state(rid)
        reason = "stop" if finish == "stop_token" else None
        new = ""
        if st.detok is not None:
            new = "" if reason else st.detok.step(token)
            if finish is not None:  # the last token: the text is complete, partial characters included
                new += st.detok.flush()
        if new:
            st.text += new
            if stop and (cut := find_stop(st.text, stop, len(new))) is not None:
                st.text, reason = st.text[:cut], "stop"
        if reason is None and finish is not None:
            reason = "stop" if finish == "complete" else "length"
        end = len(st.text) if reason else safe_end(st.text, stop, st.sent)
        delta = st.text[st.sent : end] if end > st.sent else ""
        st.sent = max(st.sent, end)
        return reason, delta

    def finish(self, rid: int, reason: str) -> str:
        """The request's whole text; it ends here. Cancelled or failed: as decoded so far, a trailing
        incomplete character included."""
        st = self.texts.pop(rid, None)
        if st is None:
            return ""
        if st.detok is not None and reason in ("cancelled", "error"):
            st.text += st.detok.flush()
        return st.text
