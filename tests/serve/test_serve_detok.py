"""Incremental detokenisation: the streamed text equals a full decode, at a cost bounded per token."""

from __future__ import annotations

import random

import pytest

from longmoe.data.tokenizer import Tokenizer
from longmoe.serve.detok import CONTEXT_TOKENS, MAX_WINDOW, IncrementalDetokenizer
from tests.helpers.tokenizer import tokenizer_for_tests

MULTIBYTE = ["é", "ß", "€", "中文", "日本語", "😀", "🦀🚀", "ÿ", "∑x²", "\u200d", "\ufffd"]


class CountingTokenizer:
    """A tokenizer proxy that records how many ids each ``decode`` call is given."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self.calls: list[int] = []
        self.special_ids, self.vocab_size = tok.special_ids, tok.vocab_size

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        self.calls.append(len(ids))
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


def stream(tok, ids: list[int], **kw) -> tuple[str, list[str]]:
    d = IncrementalDetokenizer(tok, **kw)
    parts = [d.step(t) for t in ids]
    parts.append(d.flush())
    return "".join(parts), parts


def byte_token(tok: Tokenizer, b: int) -> int:
    """The id of the byte-level symbol for byte ``b`` (GPT-2's byte-to-unicode map)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    char = chr(b) if b in printable else chr(256 + [x for x in range(256) if x not in printable].index(b))
    i = tok.token_to_id(char)
    assert i is not None
    return i


def text_cases(tok: Tokenizer, rng: random.Random, n: int) -> list[list[int]]:
    """Realistic streams: encoded text mixing ASCII, multi-byte characters and special tokens."""
    out = []
    specials = list(tok.special_ids.values())
    for _ in range(n):
        words = [
            rng.choice(["def f(x):", " return", "\n", " ", "a" * rng.randint(1, 4), *MULTIBYTE])
            for _ in range(30)
        ]
        ids = tok.encode("".join(words))
        for _ in range(3):
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(specials))
        out.append(ids)
    return out


def test_equals_full_decode_on_text_with_multibyte_and_specials(tok):
    rng = random.Random(0)
    split = 0
    for ids in text_cases(tok, rng, 60):
        text, parts = stream(tok, ids)
        assert text == tok.decode(ids, skip_special_tokens=True)
        split += sum(tok.decode([t]).endswith("\ufffd") for t in ids)
        assert not any(p.endswith("\ufffd") and "\ufffd" not in text for p in parts)
    assert split > 20  # the cases do split characters across tokens


def test_never_emits_a_partial_character(tok):
    """Each multi-byte character arrives whole in one delta, never as a replacement character first."""
    for s in ["é€😀中", "🦀" * 10, "a😀b" * 5]:
        ids = tok.encode(s)
        assert len(ids) > len(s)  # really split into byte tokens
        _, parts = stream(tok, ids)
        assert "".join(parts) == s and all("\ufffd" not in p for p in parts)


@pytest.mark.parametrize("seed", range(8))
def test_equals_full_decode_on_random_ids(tok, seed):
    """Random ids over the whole vocabulary: broken UTF-8, lone continuation bytes, specials."""
    rng = random.Random(seed)
    for n in (1, 2, 5, 40, 300):
        ids = [rng.randrange(tok.vocab_size) for _ in range(n)]
        assert stream(tok, ids)[0] == tok.decode(ids, skip_special_tokens=True)
        lead = [rng.choice([0xC3, 0xE2, 0xF0, 0x80, 0xBF]) for _ in range(n)]  # byte tokens only
        bid = [byte_token(tok, b) for b in lead]
        assert stream(tok, bid)[0] == tok.decode(bid, skip_special_tokens=True)


def test_byte_tokens_are_single_bytes(tok):
    assert [tok.decode([byte_token(tok, b)]) for b in b"az {"] == list("az {")
    assert tok.decode([byte_token(tok, b) for b in "€".encode()]) == "€"


def test_ids_outside_the_tokenizer_are_ignored(tok):
    ids = tok.encode("héllo") + [tok.vocab_size + 3] + tok.encode(" wörld")
    assert stream(tok, ids)[0] == "héllo wörld"


def test_cost_per_token_does_not_grow_with_the_output(tok):
    """Deterministic cost: ids handed to decode per step are bounded, whatever the output length."""
    rng = random.Random(1)
    for ids in (
        tok.encode("".join(rng.choice(["x = 1\n", " é", "中", "😀", " return"]) for _ in range(600))),
        [rng.randrange(tok.vocab_size) for _ in range(3000)],
        [byte_token(tok, rng.choice([0x80, 0xBF, 0xC3, 0xE2, 0xF0])) for _ in range(3000)],  # broken UTF-8
    ):
        assert len(ids) > 1000
        ct = CountingTokenizer(tok)
        d = IncrementalDetokenizer(ct)
        per_step = []
        for t in ids:
            before = sum(ct.calls)
            d.step(t)
            per_step.append(sum(ct.calls) - before)
        bound = 2 * (CONTEXT_TOKENS + MAX_WINDOW + 1) ** 2  # worst case: a cut scanning the window
        assert max(per_step) <= bound
        first, last = per_step[: len(ids) // 4], per_step[-len(ids) // 4 :]
        assert sum(last) <= 2 * sum(first) + bound  # not growing with the length already generated
        assert max(ct.calls) <= CONTEXT_TOKENS + MAX_WINDOW + 1


def test_bad_window():
    with pytest.raises(ValueError, match="max_window"):
        IncrementalDetokenizer(tokenizer_for_tests(512), max_window=2)
