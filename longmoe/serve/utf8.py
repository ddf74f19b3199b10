"""Keeps constrained sampling on well-formed UTF-8, one token at a time.

xgrammar matches JSON strings byte by byte and admits some byte sequences that are not UTF-8: a
UTF-16 surrogate written as three bytes (``ED A0..BF ..``), overlong forms (``E0 80..9F``,
``F0 80..8F``) and code points past U+10FFFF (``F4 90..``). A byte-level vocabulary has a token for
every single byte, so a random or weak model can spell them one byte per token; the text then
decodes with U+FFFD replacement characters that break ``maxLength`` and the client's parser.
``Utf8Guard`` runs the standard UTF-8 automaton (RFC 3629's well-formed byte table) over each
token's bytes ahead of time, so masking at sampling time is one table row per step.
"""

from __future__ import annotations

import torch

ACCEPT = 0  # between characters
INVALID = -1

# state -> list of (lo, hi, next state) for the next byte; anything else is invalid.
_TABLE: dict[int, list[tuple[int, int, int]]] = {
    ACCEPT: [
        (0x00, 0x7F, ACCEPT),
        (0xC2, 0xDF, 1),
        (0xE0, 0xE0, 4),
        (0xE1, 0xEC, 2),
        (0xED, 0xED, 5),
        (0xEE, 0xEF, 2),
        (0xF0, 0xF0, 6),
        (0xF1, 0xF3, 3),
        (0xF4, 0xF4, 7),
    ],
    1: [(0x80, 0xBF, ACCEPT)],  # one continuation byte left
    2: [(0x80, 0xBF, 1)],  # two left
    3: [(0x80, 0xBF, 2)],  # three left
    4: [(0xA0, 0xBF, 1)],  # after E0: no overlong three-byte forms
    5: [(0x80, 0x9F, 1)],  # after ED: no surrogates
    6: [(0x90, 0xBF, 2)],  # after F0: no overlong four-byte forms
    7: [(0x80, 0x8F, 2)],  # after F4: nothing past U+10FFFF
}
N_STATES = len(_TABLE)


def _step_table() -> list[list[int]]:
    """``[state][byte] -> next state`` (``INVALID`` where the byte is not allowed)."""
    rows = []
    for s in range(N_STATES):
        row = [INVALID] * 256
        for lo, hi, nxt in _TABLE[s]:
            for b in range(lo, hi + 1):
                row[b] = nxt
        rows.append(row)
    return rows


_STEP = _step_table()


def run(state: int, data: bytes) -> int:
    """The automaton's state after ``data`` from ``state`` (``INVALID`` once a byte is not allowed)."""
    for b in data:
        state = _STEP[state][b]
        if state == INVALID:
            return INVALID
    return state


class Utf8Guard:
    """Per-token transition tables of the UTF-8 automaton over one vocabulary.

    Tokens with no bytes (special tokens) are neutral: they are allowed and keep the state, so the
    grammar alone decides about them."""

    def __init__(self, vocab: list[bytes]) -> None:
        # next_state[s][i]: the state after token i from state s
        self.next_state = [[run(s, tok) for tok in vocab] for s in range(N_STATES)]
        self._blocked = torch.tensor([[n == INVALID for n in row] for row in self.next_state])  # [S, V]
        self._on: dict[torch.device, torch.Tensor] = {}

    def blocked(self, state: int, device: torch.device) -> torch.Tensor:
        """Which tokens would make the text ill-formed after ``state``: booleans ``[V]`` on ``device``."""
        if device not in self._on:
            self._on[device] = self._blocked.to(device)
        return self._on[device][state]

    def mask(self, logits: torch.Tensor, state: int) -> None:
        """Sets the logits ``[V]`` of the tokens that would break UTF-8 after ``state`` to -inf."""
        blocked = self.blocked(state, logits.device)
        logits[..., : blocked.numel()].masked_fill_(blocked, float("-inf"))

    def advance(self, state: int, token: int) -> int:
        return self.next_state[state][token]
