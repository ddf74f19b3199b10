"""Tokenizer: exact round trip, special-token ids, save/load."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from longmoe.data.tokenizer import SPECIAL_TOKENS, Tokenizer, TokenizerError
from longmoe.errors import UserError
from tests.helpers.tokenizer import tokenizer_for_tests


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_round_trip_any_unicode(s: str) -> None:
    """decode(encode(s)) == s for arbitrary Unicode (byte-level BPE: no unknowns, no normalisation)."""
    tok = tokenizer_for_tests()
    assert tok.decode(tok.encode(s)) == s


_PARTS = ["<|user|>", "<|eos|>", "def f(x):", "  ", "\n", "é", "🤖", "<|"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(_PARTS), max_size=20))
def test_round_trip_with_special_token_text(parts: list[str]) -> None:
    """Text that contains special-token strings still round-trips exactly."""
    tok = tokenizer_for_tests()
    s = "".join(parts)
    assert tok.decode(tok.encode(s)) == s


def test_special_ids_fixed_and_single_tokens() -> None:
    """Special tokens occupy ids 0..N-1 in declaration order and each encodes to one id."""
    tok = tokenizer_for_tests()
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i
        assert tok.encode(t) == [i]
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.doc_id == tok.eos_id


def test_save_load_same_ids(tmp_path) -> None:
    """A saved tokenizer.json reloads to the same vocabulary and encodings."""
    tok = tokenizer_for_tests()
    p = tok.save(tmp_path)
    assert p.name == "tokenizer.json"
    tok2 = Tokenizer.from_file(tmp_path)
    s = "import os\nclass A:\n    pass\n"
    assert tok2.encode(s) == tok.encode(s) and tok2.vocab_size == tok.vocab_size == 512


def test_compresses_python_source() -> None:
    """Trained merges are used: stdlib code takes well under one token per byte."""
    tok = tokenizer_for_tests()
    s = "def __init__(self, name, value=None):\n        self.name = name\n        return self\n"
    assert len(tok.encode(s)) < 0.6 * len(s.encode())


def test_vocab_too_small_is_clear_error() -> None:
    """A vocab that cannot hold the bytes and specials is rejected naming vocab_size."""
    import pytest

    with pytest.raises(ValueError, match="vocab_size"):
        Tokenizer.train(["abc"], vocab_size=100)


_NOT_TOKENIZERS = {  # file contents that are not a longmoe tokenizer.json -> words the error must carry
    "garbage.json": (bytes(range(256)) * 4, "not a tokenizer.json"),
    "empty.json": (b"", "not a tokenizer.json"),
    "list.json": (b"[1, 2]", "not a tokenizer.json"),
    "object.json": (b'{"version": "1.0"}', "not a tokenizer.json"),
    "truncated.json": (b'{"version": "1.0", "model": {"type": "BPE"', "not a tokenizer.json"),
    "foreign.json": (HFTokenizer(models.BPE()).to_str().encode(), "lacks special token"),
}


@pytest.mark.parametrize("name", sorted(_NOT_TOKENIZERS))
def test_unusable_tokenizer_files_raise_one_clear_error(tmp_path, name: str) -> None:
    """Garbage, wrong JSON or a tokenizer without longmoe's special tokens: TokenizerError naming the file."""
    raw, words = _NOT_TOKENIZERS[name]
    (tmp_path / name).write_bytes(raw)
    with pytest.raises(TokenizerError, match=words) as e:
        Tokenizer.from_file(tmp_path / name)
    assert str(tmp_path / name) in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, UserError)


@pytest.mark.parametrize(
    "context", ["holds {} jars", '{{"expression": "{} + 6"}}', "<|tool_result|>\n{}<|end|>", "x{}y", "({})"]
)
def test_a_number_is_the_same_digit_tokens_in_every_context(context: str) -> None:
    """Copying a number (story -> tool call -> answer) must not need a context-dependent re-spelling."""
    tok = tokenizer_for_tests()
    digits = [tok.encode(d) for d in "0123456789"]
    assert all(len(d) == 1 for d in digits)
    for number in ("256", "1000", "90817"):
        ids = tok.encode(context.format(number))
        want = [digits[int(c)][0] for c in number]
        assert any(ids[i : i + len(want)] == want for i in range(len(ids))), (context, number)
