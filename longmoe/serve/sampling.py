"""Per-request sampling: validated parameters, logits processing, a seeded generator per request.

Order of processing for one row of logits: repetition penalty (CTRL-style: divide positive logits
of already-seen tokens, multiply negative ones), frequency/presence penalties (OpenAI-style:
subtract ``freq · count + presence · [count > 0]`` over generated tokens), temperature, top-k,
top-p (nucleus). ``temperature == 0`` is greedy (argmax of the penalised logits).

Every request owns a ``torch.Generator``: with a ``seed`` the sampled tokens depend only on the
request's own logits, so the same seed gives the same output whether the request ran alone or in a
batch with others.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

MAX_STOP_STRINGS = 16
MAX_TOP_LOGPROBS = 20


class TokenConstraint(Protocol):
    """A per-request rule over which tokens may come next (e.g. a grammar, ``serve/structured.py``).

    The sampler calls ``mask`` on the logits before any other processing, ``accept`` with each
    chosen token, and the engine ends the request with ``"stop"`` once ``done`` is true. Speculative
    decoding also accepts a draft's proposals (so each is masked in the state it would be read in) and
    rolls them back (``rollback``) before the target verifies; a constraint without ``rollback`` gets
    its drafts masked in the state before drafting (then fewer of them are kept, the output is the same)."""

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits ``[V]`` of every token not allowed next to ``-inf``, in place."""

    def accept(self, token: int) -> None: ...

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` accepted tokens (as if they had never been accepted)."""

    @property
    def done(self) -> bool: ...


class SamplingError(ValueError):
    """A sampling parameter is out of range; the message names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass
class SamplingParams:
    """How to pick tokens for one request and when to stop. Validated on creation."""

    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    repetition_penalty: float = 1.0  # 1 = off; > 1 discourages tokens already in prompt or output
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: bool = False  # return the log-probability of every generated token
    top_logprobs: int = 0  # and of the k most likely alternatives at each step
    ignore_eos: bool = False  # keep going past the tokenizer's end-of-document token
    # score the prompt: log p(x_t | x_<t) of every prompt token and the k most likely alternatives
    # (k = this; 0: none); None: off. ``max_tokens`` may then be 0 (score without generating).
    prompt_logprobs: int | None = None
    # makes a fresh TokenConstraint for each request these parameters are used for (None: no constraint)
    constraint: Callable[[], TokenConstraint] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, lo=0, hi=MAX_TOP_LOGPROBS)
        _check_int("max_tokens", self.max_tokens, lo=0 if self.prompt_logprobs is not None else 1)
        _check_float("temperature", self.temperature, 0.0, 100.0)
        _check_int("top_k", self.top_k, lo=0)
        _check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p == 0.0:
            raise SamplingError("top_p", "expected a number in (0, 1], got 0")
        if self.seed is not None:
            _check_int("seed", self.seed, lo=-(2**63), hi=2**64 - 1)
        if len(self.stop) > MAX_STOP_STRINGS:
            raise SamplingError("stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise SamplingError("stop", f"expected non-empty strings, got {s!r}")
        for t in self.stop_token_ids:
            _check_int("stop_token_ids", t, lo=0)
        _check_float("repetition_penalty", self.repetition_penalty, 1e-3, 100.0)
        _check_float("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_float("presence_penalty", self.presence_penalty, -2.0, 2.0)
        if not isinstance(self.logprobs, bool):
            raise SamplingError("logprobs", f"expected a boolean, got {self.logprobs!r}")
        _check_int("top_logprobs", self.top_logprobs, lo=0, hi=MAX_TOP_LOGPROBS)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _check_int(name: str, v: object, lo: int | None = None, hi: int | None = None) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SamplingError(name, f"expected an integer, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise SamplingError(name, f"expected an integer {rng}, got {v}")


def _check_float(name: str, v: object, lo: float, hi: float) -> None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise SamplingError(name, f"expected a finite number, got {v!r}")
    if not lo <= v <= hi:
        raise SamplingError(name, f"expected a number in [{lo}, {hi}], got {v}")


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """The request's own RNG: seeded from ``seed`` or, without one, from the OS."""
    g = torch.Generator(device=device)
    if seed is None:
        seed = int.from_bytes(os.urandom(8), "little")
    g.manual_seed(seed % 2**64)
    return g


class SamplerState:
    """What the sampler remembers per request: token counts for the penalties, and the RNG."""

    def __init__(self, params: SamplingParams, prompt_ids: list[int], vocab_size: int, device) -> None:
        self.params = params
        self.generator = make_generator(params.seed, device)
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # prompt + output
        if prompt_ids:
            self.seen[torch.tensor([i for i in prompt_ids if 0 <= i < vocab_size], dtype=torch.long)] = True
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # output only
        self.constraint = params.constraint() if params.constraint is not None else None

    def observe(self, token: int) -> None:
        self.seen[token] = True
        self.counts[token] += 1.0
        if self.constraint is not None:
            self.constraint.accept(token)

    @property
    def constrained_done(self) -> bool:
        """The request's constraint is complete: nothing more may be generated."""
        return self.constraint is not None and self.constraint.done


def process_logits(logits: torch.Tensor, st: SamplerState) -> torch.Tensor:
    """``logits [V]`` (fp32) -> penalised, temperature-scaled, top-k/top-p filtered logits ``[V]``."""
    p = st.params
    x = logits.float().clone()
    if st.constraint is not None:
        st.constraint.mask(x)
    if p.repetition_penalty != 1.0:
        r = p.repetition_penalty
        pen = torch.where(x > 0, x / r, x * r)
        x = torch.where(st.seen, pen, x)
    if p.frequency_penalty or p.presence_penalty:
        x = x - p.frequency_penalty * st.counts - p.presence_penalty * (st.counts > 0).float()
    if p.greedy:
        return x
    x = x / p.temperature
    V = x.numel()
    if 0 < p.top_k < V:
        kth = torch.topk(x, p.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
        drop = before >= p.top_p  # keeps the smallest prefix whose mass reaches top_p (>= 1 token)
        x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return x


@dataclass
class TokenChoice:
    token: int
    logprob: float | None = None  # log p(token) under the model (before sampling transforms)
    top: list[tuple[int, float]] | None = None  # (token, logprob) of the most likely alternatives


def sample(logits: torch.Tensor, st: SamplerState) -> TokenChoice:
    """Pick the next token from ``logits [V]``; logprobs come from the model's raw distribution."""
    x = process_logits(logits, st)
    if st.params.greedy:
        tok = int(torch.argmax(x))
    else:
        probs = torch.softmax(x, dim=-1)
        tok = int(torch.multinomial(probs, 1, generator=st.generator))
    return record_choice(tok, logits, st)


def record_choice(tok: int, logits: torch.Tensor, st: SamplerState) -> TokenChoice:
    """Record ``tok`` as picked from ``logits [V]``: its logprobs if asked for, and the penalty counts."""
    choice = TokenChoice(tok)
    if st.params.logprobs or st.params.top_logprobs:
        lp = torch.log_softmax(logits.float(), dim=-1)
        choice.logprob = float(lp[tok])
        if st.params.top_logprobs:
            v, i = torch.topk(lp, st.params.top_logprobs)
            choice.top = [(int(a), float(b)) for a, b in zip(i, v, strict=True)]
    st.observe(tok)
    return choice
