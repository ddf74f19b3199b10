"""The UTF-8 guard under grammar-constrained sampling: its automaton agrees with Python's strict
decoder on random and adversarial bytes, and a JSON string constraint never lets a surrogate,
overlong or out-of-range sequence through even when xgrammar alone would."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from longmoe.serve.structured import JsonFormat, JsonGrammars, token_bytes
from longmoe.serve.utf8 import ACCEPT, INVALID, run
from tests.helpers.models import VOCAB
from tests.helpers.tokenizer import tokenizer_for_tests

ILL_FORMED = [
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xe0\x80\xaf",
    b"\xf0\x8f\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xc0\xaf",
    b"\xc1\xbf",
    b"\xf5\x80\x80\x80",
    b"\xff",
    b"\x80",
    b"\xe4\xb8",
]
WELL_FORMED = [
    b"\xed\x9f\xbf",
    b"\xee\x80\x80",
    b"\xe0\xa0\x80",
    b"\xf0\x90\x80\x80",
    b"\xf4\x8f\xbf\xbf",
    "héllo, 世界 🙂".encode(),
]


def well_formed(data: bytes) -> bool:
    try:
        data.decode("utf-8", errors="strict")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("data", ILL_FORMED + WELL_FORMED)
def test_automaton_on_edge_cases(data):
    assert (run(ACCEPT, data) == ACCEPT) == well_formed(data)


def test_automaton_agrees_with_python_on_random_bytes():
    rng = random.Random(0)
    lead = [0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]
    cont = [0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF]
    for _ in range(5000):
        data = bytes(rng.choice(lead + cont * 2) for _ in range(rng.randint(1, 8)))
        assert (run(ACCEPT, data) == ACCEPT) == well_formed(data), data
        assert (run(ACCEPT, data) != INVALID) == well_formed_prefix(data), data


def well_formed_prefix(data: bytes) -> bool:
    """``data`` can be completed to well-formed UTF-8 (the decoder only needs more bytes)."""
    tails = (bytes(t) for n in range(4) for t in itertools.product((0x80, 0x90, 0xA0), repeat=n))
    return any(well_formed(data + tail) for tail in tails)


def test_string_constraint_masks_surrogates_after_ed():
    tok = tokenizer_for_tests(VOCAB)
    raw = token_bytes(tok)
    byte_id = {b[0]: i for i, b in enumerate(raw) if len(b) == 1}
    grammars = JsonGrammars(tok, tok.vocab_size)
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    g = grammars.constraint(JsonFormat(schema))()
    for i in tok.encode('{"s": "'):
        g.accept(i)
    g.accept(byte_id[0xED])
    x = torch.zeros(tok.vocab_size)
    g.mask(x)
    allowed = {raw[i] for i in torch.nonzero(x == 0).flatten().tolist()}
    assert bytes([0x9F]) in allowed and bytes([0x80]) in allowed
    assert not any(b[0] >= 0xA0 for b in allowed if b)  # ED A0..BF would be a UTF-16 surrogate
    with pytest.raises(RuntimeError, match="UTF-8"):
        g.accept(byte_id[0xA1])
