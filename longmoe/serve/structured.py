"""Structured outputs: JSON (any object, or one matching a JSON Schema) by grammar-constrained decoding.

xgrammar compiles the grammar against longmoe's byte-level BPE vocabulary once (``TokenizerInfo``
built from each id's raw bytes; special tokens and tokens with raw control bytes get no bytes, so
xgrammar never allows them, except ``<|eos|>`` / ``<|end|>`` as stop tokens) and then, per request,
a ``GrammarMatcher`` fills a token bitmask before every sampled token: tokens that cannot continue
a valid document get ``-inf``. A ``Utf8Guard`` masks on top of it the bytes that would make the
text ill-formed UTF-8 (xgrammar's string rule admits surrogates and overlong forms).
The request stops (``"stop"``) as soon as the document is complete; ``max_tokens`` can still cut it
(``"length"``: the JSON is then incomplete, as at OpenAI).

Compiled grammars are cached by a hash of the canonical schema; compiling runs wherever the caller
runs it (the server: a worker thread).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr

from longmoe.data.tokenizer import Tokenizer
from longmoe.serve.sampling import TokenConstraint
from longmoe.serve.utf8 import ACCEPT as UTF8_ACCEPT
from longmoe.serve.utf8 import INVALID as UTF8_INVALID
from longmoe.serve.utf8 import Utf8Guard

MAX_CACHED_GRAMMARS = 64


class StructuredOutputError(ValueError):
    """A response format that cannot be compiled; ``param`` names the field (``response_format``)."""

    def __init__(self, message: str, param: str = "response_format") -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class JsonFormat:
    """What the output must be: any JSON object (``schema is None``: OpenAI's ``json_object``) or a
    document matching ``schema``. Either is generated compact (``", "`` and ``": "`` separators)."""

    schema: dict[str, Any] | None = None

    def key(self) -> str:
        canon = json.dumps(self.schema, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(canon.encode()).hexdigest()


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte -> printable-character map that byte-level BPE vocabularies use."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {b: b for b in keep}, 0
    for b in range(256):
        if b not in chars:
            chars[b], n = 256 + n, n + 1
    return {chr(c): b for b, c in chars.items()}


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """Each id's raw bytes as the model emits them; special tokens map to ``b""`` (never text)."""
    dec = _byte_decoder()
    special = set(tokenizer.special_ids.values())
    out = []
    for i in range(tokenizer.vocab_size):
        tok = tokenizer.id_to_token(i)
        out.append(b"" if i in special or tok is None else bytes(dec[c] for c in tok))
    return out


def grammar_vocab(tokenizer: Tokenizer) -> list[bytes]:
    """``token_bytes`` with every token holding a raw control byte (< 0x20) also blanked, so it is
    never allowed: JSON forbids them inside strings (they are escaped), the grammars here are compact
    (no free whitespace), and xgrammar's token-level mask admits them inside strings."""
    return [b"" if any(c < 0x20 for c in b) else b for b in token_bytes(tokenizer)]


class GrammarConstraint:
    """One request's grammar state: a ``TokenConstraint`` over a compiled grammar."""

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int, utf8: Utf8Guard) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self.utf8, self.utf8_state = utf8, UTF8_ACCEPT
        self._utf8_before: list[int] = []  # the UTF-8 state before each accepted token (for rollback)
        self._done = False

    def mask(self, logits: torch.Tensor) -> None:
        self.matcher.fill_next_token_bitmask(self.bitmask)
        if logits.device.type == "cpu":
            xgr.apply_token_bitmask_inplace(logits.view(1, -1), self.bitmask, vocab_size=self.vocab_size)
        else:  # any other device: unpack the bits with torch there (no xgrammar kernel needed)
            logits.masked_fill_(~self.allowed(logits.device), float("-inf"))
        self.utf8.mask(logits, self.utf8_state)  # the grammar admits some ill-formed byte sequences

    def allowed(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The bitmask last filled, as booleans ``[V]`` on ``device`` (bit ``i % 32`` of word ``i // 32``)."""
        words = self.bitmask[0].to(device)
        bits = (words.unsqueeze(-1) >> torch.arange(32, device=device, dtype=words.dtype)) & 1
        return bits.flatten()[: self.vocab_size].bool()

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"token {token} violates the grammar (the sampler ignored its mask)")
        state = self.utf8.advance(self.utf8_state, token)
        if state == UTF8_INVALID:
            self.matcher.rollback(1)
            raise RuntimeError(f"token {token} is not well-formed UTF-8 here (the sampler ignored its mask)")
        self._utf8_before.append(self.utf8_state)
        self.utf8_state = state
        # complete: the document is closed (the stop token was accepted, or nothing may follow)
        self._done = self.matcher.is_terminated() or self.matcher.is_completed()

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` accepted tokens (speculative decoding: rejected drafts)."""
        if n <= 0:
            return
        if n > len(self._utf8_before):
            raise ValueError(f"rollback: {n} tokens but only {len(self._utf8_before)} were accepted")
        self.matcher.rollback(n)
        self.utf8_state = self._utf8_before[-n]
        del self._utf8_before[-n:]
        self._done = self.matcher.is_terminated() or self.matcher.is_completed()

    @property
    def done(self) -> bool:
        return self._done


class JsonGrammars:
    """Compiles and caches JSON grammars for one tokenizer; hands out per-request constraints."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        stops = [tokenizer.eos_id, tokenizer.end_id]
        vocab = grammar_vocab(tokenizer)
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=stops)
        self.vocab_size = vocab_size
        self.utf8 = Utf8Guard(vocab)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (cache misses)

    def compile(self, fmt: JsonFormat) -> xgr.CompiledGrammar:
        """The compiled grammar of ``fmt`` (cached by schema hash); bad schemas raise
        ``StructuredOutputError``. CPU work: call it off the event loop."""
        key = fmt.key()
        with self._lock:  # compiles are milliseconds: one at a time keeps the compiler single-threaded
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            g = self._compile_schema({"type": "object"} if fmt.schema is None else fmt.schema)
            self._cache[key] = g
            self.compiled += 1
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return g

    def _compile_schema(self, schema: dict[str, Any]) -> xgr.CompiledGrammar:
        if not isinstance(schema, dict):
            raise StructuredOutputError(f"the schema must be a JSON object, got {type(schema).__name__}")
        try:
            text = json.dumps(schema)
            return self._compiler.compile_json_schema(text, any_whitespace=False, strict_mode=True)
        except (RuntimeError, ValueError, TypeError) as e:
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise StructuredOutputError(f"invalid JSON schema: {msg}") from None

    def constraint(self, fmt: JsonFormat) -> Callable[[], TokenConstraint]:
        """A factory of fresh per-request constraints (for ``SamplingParams.constraint``)."""
        compiled = self.compile(fmt)
        return lambda: GrammarConstraint(compiled, self.vocab_size, self.utf8)
