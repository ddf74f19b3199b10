"""Incremental detokenisation: a request's text grows token by token at a cost bounded per token.

Decoding the whole output after every token costs O(output length) per token. Instead, as vLLM and
``tokenizers.DecodeStream`` do, only a small window of recent ids is decoded:

- ``ids[:read]`` is the *context*: the previous complete segment (if at most ``CONTEXT_TOKENS`` tokens),
  already emitted, kept only so a tokenizer whose decoding depends on the previous token (e.g. a
  leading space) sees it;
- ``ids[read:]`` are the tokens whose text is not yet final.

A byte-level token may end in the middle of a multi-byte UTF-8 character; its decoding then ends in
the replacement character ``\\ufffd``, which the next tokens may turn into a real character. So the
text of the window is emitted up to, not including, a trailing ``\\ufffd``; once the window's text
ends in a complete character, the tokens since ``read`` become the new context.

If the window keeps ending in ``\\ufffd`` (invalid bytes, which a model may produce, or a run of
tokens that each split a character) it is cut after ``max_window`` tokens at a token boundary where
decoding the two halves separately gives the same text; an incomplete character spans at most 3
bytes, so with at least 3 tokens after the cut nothing later can change the text before it. Only if
no such boundary exists in the window (every one of them splits a character) does the window keep
growing. The concatenation of every ``step`` and the final ``flush`` equals ``tokenizer.decode`` of
all the ids with special tokens skipped.
"""

from __future__ import annotations

from typing import Protocol

REPLACEMENT = "\ufffd"
MAX_WINDOW = 16  # undecided tokens before the window is cut (only reached with broken UTF-8)
CONTEXT_TOKENS = 4  # a longer complete segment is not kept as context (the window stays small)
_TAIL = 3  # tokens kept after a cut: at least 3 bytes, as long as an incomplete UTF-8 character


class _Decodes(Protocol):  # a data.tokenizer.Tokenizer; not imported, so request bookkeeping stays light
    special_ids: dict[str, int]
    vocab_size: int

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Feed token ids one at a time; get back the text that became final (special tokens skipped)."""

    def __init__(self, tokenizer: _Decodes, max_window: int = MAX_WINDOW) -> None:
        if max_window <= _TAIL:
            raise ValueError(f"max_window: expected an integer > {_TAIL}, got {max_window}")
        self.tokenizer, self.max_window = tokenizer, max_window
        self._skip = frozenset(tokenizer.special_ids.values())  # decode drops them: no bytes
        self._vocab = tokenizer.vocab_size
        self.ids: list[int] = []  # context + undecided tokens
        self.read = 0  # ids[:read] is context (emitted); ids[read:] undecided
        self.emitted = 0  # characters of decode(ids) already returned

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def step(self, token: int) -> str:
        """Add one token; return the new final text (maybe ``""``)."""
        if token in self._skip or not 0 <= token < self._vocab:
            return ""  # no bytes of text: special, or an id the tokenizer does not know
        self.ids.append(token)
        text = self._decode(self.ids)
        pending = text.endswith(REPLACEMENT)
        end = len(text) - pending
        delta = text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        if not pending:  # complete: the undecided tokens become the next context (if short)
            seg = self.ids[self.read :]
            self.ids = seg if len(seg) <= CONTEXT_TOKENS else []
            self.read = len(self.ids)
            self.emitted = len(self._decode(self.ids)) if self.ids else 0
        elif len(self.ids) - self.read > self.max_window:
            self._cut(text)
        return delta

    def _cut(self, text: str) -> None:
        """Drop the window's head at a boundary where decoding splits cleanly (see module docstring)."""
        for c in range(len(self.ids) - _TAIL, self.read, -1):
            head = self._decode(self.ids[:c])
            if head + self._decode(self.ids[c:]) == text:
                self.ids, self.read = self.ids[c:], 0
                self.emitted -= len(head)
                return

    def flush(self) -> str:
        """The rest of the text (a trailing incomplete character as ``\\ufffd``); the stream ends."""
        text = self._decode(self.ids)
        delta = text[self.emitted :]
        self.ids, self.read, self.emitted = [], 0, 0
        return delta
