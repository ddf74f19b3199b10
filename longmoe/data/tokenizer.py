"""Byte-level BPE tokenizer (trained with the ``tokenizers`` library) plus longmoe's special tokens.

Byte-level means every Unicode string maps to bytes first, so ``decode(encode(s)) == s`` holds for
any input (no unknown token, no normalisation). Digits are split one per token (as Llama and
DeepSeek do), so a number is the same tokens in every context: models copy and compute on them.
Special tokens mark document boundaries, chat roles, tool calls/results and image spans; their ids
are fixed (0..N-1) so a config can rely on them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from longmoe.errors import UserError

TOKENIZER_FILE = "tokenizer.json"  # the tokenizer's file in a model directory

# Order fixes the ids: pad=0, bos=1, eos=2 (document boundary), ...
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|bos|>",
    "<|eos|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<|tool_call|>",
    "<|tool_result|>",
    "<|image|>",
    "<|/image|>",
    "<|image_patch|>",
)
_ATTR = {  # attribute name -> token
    "pad_id": "<|pad|>",
    "bos_id": "<|bos|>",
    "eos_id": "<|eos|>",
    "system_id": "<|system|>",
    "user_id": "<|user|>",
    "assistant_id": "<|assistant|>",
    "end_id": "<|end|>",
    "tool_call_id": "<|tool_call|>",
    "tool_result_id": "<|tool_result|>",
    "image_start_id": "<|image|>",
    "image_end_id": "<|/image|>",
    "image_patch_id": "<|image_patch|>",
}
MIN_VOCAB = len(SPECIAL_TOKENS) + 256  # specials + the 256 byte symbols


class TokenizerError(UserError, ValueError):
    """A tokenizer file that cannot be used: not a tokenizer, or not one trained by longmoe."""


class Tokenizer:
    """Thin wrapper: encode/decode, special-token ids as attributes (the chat template is
    ``longmoe.data.chat.render_messages``)."""

    def __init__(self, hf: _HFTokenizer) -> None:
        self._tok = hf
        for attr, tok in _ATTR.items():
            i = hf.token_to_id(tok)
            if i is None:
                raise TokenizerError(f"tokenizer lacks special token {tok!r}; was it trained by longmoe?")
            setattr(self, attr, i)
        self.doc_id = self.eos_id  # the document-boundary token

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _blank() -> _HFTokenizer:
        tok = _HFTokenizer(models.BPE())
        # Digits first: every digit is its own pre-token, so "256" is the same three tokens in a story,
        # in a JSON string and in a tool result. With merged digit runs the same number splits
        # differently by context (" 2|5|6" vs "25|6"), and copying it is a learned translation.
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        return tok

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2, show_progress: bool = False
    ) -> Tokenizer:
        """Train byte-level BPE on ``texts`` (any iterable of strings, streamed)."""
        if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
            raise ValueError(
                f"vocab_size={vocab_size!r} is invalid: expected an integer >= {MIN_VOCAB} "
                f"({len(SPECIAL_TOKENS)} special tokens + 256 bytes)"
            )
        tok = cls._blank()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=show_progress,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        p = Path(path)
        if p.is_dir():
            p = p / TOKENIZER_FILE
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {p}")
        try:
            hf = _HFTokenizer.from_file(str(p))
        except Exception as e:  # the Rust parser raises a bare Exception for any malformed file
            detail = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TokenizerError(f"{p} is not a tokenizer.json file ({detail})") from e
        try:
            return cls(hf)
        except TokenizerError as e:
            raise TokenizerError(f"{p}: {e}") from e

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` (``path`` may be the file or its directory)."""
        p = Path(path)
        if p.suffix != ".json":
            p = p / TOKENIZER_FILE
        p.parent.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(p))
        return p

    # ------------------------------------------------------------------ core API
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        # through encode_batch: it releases the GIL (encode does not), so a long text tokenised on a
        # worker thread leaves the other threads running (the server's event loop, the engine)
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    @property
    def special_ids(self) -> dict[str, int]:
        return {t: self._tok.token_to_id(t) for t in SPECIAL_TOKENS}
