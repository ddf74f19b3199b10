"""The inference engine: request state, a continuous-batching scheduler, streaming results.

One background thread owns the model and runs scheduler steps while there is work. A step:

1. takes new submissions and drops cancelled requests (their cache rows and budget are freed);
2. admits waiting requests in arrival order while the batch has room (``max_batch``) and the
   ``CacheBudget`` can reserve their whole life (prompt + ``max_tokens``); the rest wait;
3. runs **one batched decode step** for every request that is generating: the rows live in one
   batched ``Cache`` (rows of different lengths; MLA rows are masked to their own length), one
   forward of ``[B, 1]`` tokens, then per-row sampling with each request's own RNG;
4. feeds **one prefill chunk** (about ``prefill_chunk`` prompt tokens, shared as a ``[k, L]`` batch by
   the oldest prefilling requests) into those requests' own caches, so a long prompt advances a
   slice per step while the other requests keep decoding between its slices;
5. changes the batch membership: finished rows leave (``Cache.select``), requests whose prefill just
   ended join (``Cache.stack``). Membership only changes here, between steps.

Two options change how the work is done, never the greedy output: **prefix reuse**
(``serve/prefix_cache.py``: a request starts from a stored snapshot of the longest block-aligned
prefix of its prompt that an earlier request computed) and **speculative decoding**
(``serve/speculative.py``: with a draft model, step 3 drafts ``k`` tokens per row, verifies them in one
target forward and rolls rejected rows back).

**Sessions** (``serve/session.py``) keep a finished request's cache row for the conversation's next
request, which supplies only its new tokens: an agent episode prefills each observation once.

**Images** (``serve/prompt_images.py``): a request may carry the ``Patches`` of the images in its
prompt; they are encoded once and each prefill chunk gets the embeddings of the patch tokens it feeds.

Rows never interact (the model is row-independent and MoE routing is per token), so a request's
tokens are the same alone or batched; sampling depends only on its own logits and seed.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path

import torch

from longmoe.cache import Cache
from longmoe.checkpoint import load_model
from longmoe.data.chat import encode_chat
from longmoe.data.images import image_span
from longmoe.data.tokenizer import Tokenizer
from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from longmoe.quantize import quantize_model
from longmoe.serve.budget import CacheBudget, CacheSpec
from longmoe.serve.compiled import CompiledSteps
from longmoe.serve.detok import IncrementalDetokenizer
from longmoe.serve.engine_config import EngineConfig
from longmoe.serve.errors import EngineError
from longmoe.serve.prefix_cache import PrefixCache
from longmoe.serve.prompt_images import check_images, chunk_embeds, image_token_ids
from longmoe.serve.request import (
    FINISH_REASONS,
    Completion,
    Event,
    Request,
    RequestHandle,
    check_ids,
    check_lengths,
    plain_greedy,
)
from longmoe.serve.sampling import SamplerState, SamplingParams, TokenChoice, sample
from longmoe.serve.session import Session, Sessions
from longmoe.serve.speculative import Speculator

log = logging.getLogger(__name__)

_TPS_WINDOW_S = 10.0
_MIN_PREFILL_ROW = 16  # fewest prompt tokens per row when prefill chunks are shared by several requests


class Engine:
    """Continuous-batching generation over a ``LongMoE`` model (see the module docstring)."""

    def __init__(
        self,
        model: LongMoE,
        tokenizer: Tokenizer,
        config: EngineConfig | None = None,
        draft: LongMoE | None = None,
    ) -> None:
        """``draft``: a small model sharing the vocabulary; turns on speculative decoding."""
        self.cfg = config or EngineConfig()
        if self.cfg.quantize and getattr(model, "quantization", None) != self.cfg.quantize:
            quantize_model(model, self.cfg.quantize)  # in place: the float weights are released
        self.model = model.eval()
        self.compiled = CompiledSteps(model) if self.cfg.compile else None
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.vocab_size = model.cfg.vocab_size
        if tokenizer.vocab_size > self.vocab_size:
            raise ValueError(
                f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is {self.vocab_size}"
            )
        self.speculator = (
            None
            if draft is None
            else Speculator(model, draft.to(self.device), self.cfg.num_speculative_tokens)
        )
        self.spec = CacheSpec.of_cache(self._new_cache())
        self.budget = CacheBudget(self.spec, self.cfg.cache_budget_bytes, self.cfg.block_size)
        self.prefix = (
            PrefixCache(self.budget, self.cfg.prefix_block_size, self.device)
            if self.cfg.prefix_cache
            else None
        )
        self.sessions = Sessions(self.budget)
        # a model with a vision encoder must never generate an image token (decode has no pixels)
        banned = image_token_ids(model, tokenizer)
        self._banned = torch.tensor(banned, device=self.device) if banned else None
        if self.speculator is not None:
            self.speculator.banned = self._banned
        self._closing: list[Session] = []
        self._cv = threading.Condition()
        self._incoming: list[Request] = []
        self._waiting: deque[Request] = deque()
        self._prefilling: list[Request] = []
        self._joining: list[Request] = []
        self._batch_reqs: list[Request] = []
        self._batch: Cache | None = None
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cancel_pending = False
        self.cache_bytes_in_use = 0
        self.counters = {"requests": 0, "prompt_tokens": 0, "generated_tokens": 0, "steps": 0}
        self.finished = dict.fromkeys(FINISH_REASONS, 0)
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dir(cls, path: str | Path, **opts) -> Engine:
        """Load a model directory or a training run (its ``final/`` or newest complete checkpoint).

        ``opts`` are ``EngineConfig`` fields (``prefill_chunk``, ``max_batch``, ``cache_budget_bytes``,
        ``device``, ...)."""
        known = {f.name for f in fields(EngineConfig)}
        bad = sorted(set(opts) - known)
        if bad:
            raise TypeError(f"Engine.from_dir: unknown options {bad}; expected some of {sorted(known)}")
        cfg = EngineConfig(**opts)
        model, tokenizer, _ = load_model(path, device=cfg.device)
        draft = None if cfg.draft_model is None else load_model(cfg.draft_model, device=cfg.device).model
        return cls(model, tokenizer, cfg, draft)

    @property
    def max_context(self) -> int:
        """Tokens a request may hold (prompt + completion): ``EngineConfig.max_context`` or the model's
        ``max_seq_len``."""
        return int(self.cfg.max_context or self.model.cfg.max_seq_len)

    def encode_prompt(self, prompt: str | list[int], images: Sequence[Patches] = ()) -> list[int]:
        """Token ids of a prompt; a text prompt's ``images`` come first, each as its token span."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, bos=False)
            spans = [t for p in images for t in image_span(p, self.tokenizer)]
            return [self.tokenizer.bos_id] * self.cfg.add_bos + spans + ids
        return check_ids(prompt, self.vocab_size)

    def encode_chat(
        self, messages: list[dict], tools: list[dict] | None = None, images: Sequence[Patches] = ()
    ) -> list[int]:
        """Chat messages (and the tools shown to the model) -> prompt ids via the tokenizer's
        template, ending in ``<|assistant|>\\n``; ``images`` are the image parts' ``Patches`` in order."""
        try:
            if images:
                return encode_chat(self.tokenizer, messages, True, self.cfg.add_bos, tools, images=images).ids
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
        except (ValueError, AttributeError, TypeError) as e:
            raise EngineError("messages", str(e)) from e
        return self.tokenizer.encode(text, bos=self.cfg.add_bos)

    # ------------------------------------------------------------------ public API
    def submit(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        sink: Callable[[Event], None] | None = None,
        session: Session | None = None,
        images: Sequence[Patches] = (),
    ) -> RequestHandle:
        """Queue a request; events go to ``sink`` (called from the engine thread) or the handle.

        With a ``session`` (``open_session``) the prompt is only what is new since the session's last
        request (its whole context and kept cache row are reused; see ``serve/session.py``).
        ``images``: the ``Patches`` of the prompt's image spans in order (a text prompt gets them in
        front, ``encode_prompt``); see ``serve/prompt_images.py``."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params: expected SamplingParams, got {type(params).__name__}")
        if session is not None:
            session.check()
            if isinstance(prompt, str) and session.tokens:  # a continuation: no second <|bos|>
                prompt = self.encode_prompt(prompt, images)[self.cfg.add_bos :]
            ids = session.tokens + self.encode_prompt(prompt, images)
            images = [*session.images, *images]  # the context's earlier images come first
        else:
            ids = self.encode_prompt(prompt, images)
        check_lengths(len(ids), params.max_tokens, self.max_context, self.budget)
        prompt_images = check_images(self.model, ids, images, self.tokenizer.image_patch_id)
        q: queue.Queue | None = None
        if sink is None:
            q = queue.Queue()
            sink = q.put
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= {self.tokenizer.eos_id, self.tokenizer.end_id}
        req = Request(next(self._ids), ids, params, sink, stop_ids=frozenset(stop_ids), session=session)
        req.images = prompt_images
        req.plain_greedy = plain_greedy(params)
        req.sampler = SamplerState(params, ids, self.vocab_size, self.device)
        req.detok = IncrementalDetokenizer(self.tokenizer)
        with self._cv:
            if self._closed:
                raise RuntimeError("engine is closed")
            if len(self._waiting) + len(self._incoming) >= self.cfg.max_waiting:
                raise EngineError("queue", f"is full ({self.cfg.max_waiting} waiting requests)", 503)
            if session is not None:
                session.check()
                session.active = True
            self._incoming.append(req)
            self.counters["requests"] += 1
            self.counters["prompt_tokens"] += len(ids)
            self._ensure_thread()
            self._cv.notify_all()
        return RequestHandle(req, q, self._cancel)

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        session: Session | None = None,
        images: Sequence[Patches] = (),
    ) -> Completion:
        return self.submit(prompt, params, session=session, images=images).result()

    def open_session(self) -> Session:
        """A new conversation whose requests continue one another on a kept cache row."""
        if self.speculator is not None:
            raise EngineError("session", "sessions are not supported with speculative decoding")
        return Session()

    def close_session(self, session: Session) -> None:
        """Release the session's kept row (after its running request, if any, finishes)."""
        with self._cv:
            session.closed = True
            self._closing.append(session)
            self._ensure_thread()
            self._cv.notify_all()

    def generate_batch(
        self,
        prompts: list[str | list[int]],
        params_list: list[SamplingParams] | SamplingParams | None = None,
    ) -> list[Completion]:
        """All prompts submitted at once (they share decode steps); results in prompt order."""
        if params_list is None or isinstance(params_list, SamplingParams):
            params_list = [params_list or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"params_list: expected {len(prompts)} entries, got {len(params_list)}")
        handles = [self.submit(p, s) for p, s in zip(prompts, params_list, strict=True)]
        return [h.result() for h in handles]

    def stream(self, prompt: str | list[int], params: SamplingParams | None = None) -> Iterator[str]:
        """Text deltas as they are produced (stopping early cancels the request)."""
        h = self.submit(prompt, params)
        try:
            for ev in h.events():
                if ev.delta:
                    yield ev.delta
                if ev.done is not None and ev.done.finish_reason == "error":
                    raise RuntimeError(f"request {h.id} failed: {ev.done.error}")
        finally:
            if h.completion is None:
                h.cancel()

    def stats(self) -> dict[str, float]:
        now = time.monotonic()
        recent = [(t, n) for t, n in list(self._recent) if now - t <= _TPS_WINDOW_S]
        return {
            **self.counters,
            **{f"finished_{k}": v for k, v in self.finished.items()},
            "waiting": len(self._waiting) + len(self._incoming),
            "running": len(self._prefilling) + len(self._joining) + len(self._batch_reqs),
            "cache_bytes_in_use": self.cache_bytes_in_use,
            "cache_bytes_reserved": self.budget.reserved_bytes,
            "cache_budget_bytes": self.budget.budget,
            "tokens_per_second": sum(n for _, n in recent) / _TPS_WINDOW_S,
            **(self.prefix.report() if self.prefix is not None else {}),
            **self.sessions.report(),
            **(self.speculator.report() if self.speculator is not None else {}),
        }

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ worker thread
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="longmoe-engine", daemon=True)
            self._thread.start()
            ref = weakref.ref(self)
            atexit.register(lambda: (e := ref()) is not None and e.close())

    def _has_work(self) -> bool:
        return bool(
            self._incoming or self._waiting or self._prefilling or self._joining or self._batch_reqs
        ) or bool(self._closing)

    def _cancel(self, req: Request) -> None:
        with self._cv:
            req.cancelled = True
            self._cancel_pending = True
            self._cv.notify_all()

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._closed and not self._has_work():
                        self._cv.wait()
                    if self._closed:
                        break
                try:
                    self.step()
                except Exception as e:  # a failing step must not kill the engine: fail its requests
                    log.exception("engine step failed")
                    self._fail_all(f"{type(e).__name__}: {e}")
            self._fail_all("engine closed", reason="cancelled")

    def step(self) -> None:
        """One scheduler iteration (see the module docstring); runs on the engine thread."""
        with self._cv:
            self._waiting.extend(self._incoming)
            self._incoming.clear()
            reap, self._cancel_pending = self._cancel_pending, False
            closing, self._closing = self._closing, []
        for s in closing:
            if not s.active:  # an active one is dropped when its request finishes
                self.sessions.drop(s)
        if reap:
            self._reap_cancelled()
        self._admit()
        n_tokens = 0
        if self._batch_reqs:
            n_tokens += self._decode_step()
        if self._prefilling:
            n_tokens += self._prefill_step()
        self._rebuild_batch()
        self.counters["steps"] += 1
        self.counters["generated_tokens"] += n_tokens
        now = time.monotonic()
        self._recent.append((now, n_tokens))
        while self._recent and now - self._recent[0][0] > _TPS_WINDOW_S:
            self._recent.popleft()
        live = sum(r.cache.nbytes() for r in self._prefilling + self._joining if r.cache is not None)
        live += sum(s.cache.nbytes() for s in self.sessions.idle.values() if s.cache is not None)
        self.cache_bytes_in_use = live + (self._batch.nbytes() if self._batch is not None else 0)

    def _reap_cancelled(self) -> None:
        for r in [r for r in self._waiting if r.cancelled]:
            self._waiting.remove(r)
            self._finish(r, "cancelled")
        for lst in (self._prefilling, self._joining):
            for r in [r for r in lst if r.cancelled]:
                lst.remove(r)
                r.cache = None
                self._finish(r, "cancelled")
        for r in self._batch_reqs:
            if r.cancelled and r.finish is None:
                self._finish(r, "cancelled")
        self._rebuild_batch()

    def _admit(self) -> None:
        while self._waiting:
            if len(self._prefilling) + len(self._joining) + len(self._batch_reqs) >= self.cfg.max_batch:
                return
            r = self._waiting[0]
            s = r.session
            key = s.key if s is not None else None
            while not self.budget.try_reserve(r.id, len(r.prompt_ids) + r.params.max_tokens, key):
                if self.prefix is not None and self.prefix.evict_one():  # snapshots go first,
                    continue
                if not self.sessions.evict_one(keep=s):  # then idle sessions' kept rows
                    return  # wait for running requests to free their reservations (arrival order kept)
            self._waiting.popleft()
            if s is not None and s.cache is not None:  # continue the session's kept row
                r.cache, r.n_fed = self.sessions.take(s)
                r.reused = r.n_fed
                self.sessions.stats.tokens_reused += r.n_fed
            else:
                r.cache = self._new_cache()
            if s is not None:
                self.sessions.stats.turns += 1
            if self.prefix is not None and r.reused == 0:
                r.block_hashes = self.prefix.hashes(r.prompt_ids, r.image_marks)
                self.prefix.reuse(r)
            self._prefilling.append(r)

    def _new_cache(self) -> Cache:
        """An empty one-row cache (the draft model's layers included when speculating)."""
        if self.speculator is not None:
            return self.speculator.new_cache(1, self.device)
        return self.model.new_cache(1, self.device)

    def _forward(
        self, x: torch.Tensor, cache: Cache, image_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Prompt tokens ``x [B, T]`` into ``cache`` (and the draft's layers); the target's logits."""
        if self.speculator is not None:
            return self.speculator.forward(x, cache, image_embeds)
        return self.model(x, cache=cache, image_embeds=image_embeds).logits

    def _prefill_step(self) -> int:
        """Feed one chunk of about ``prefill_chunk`` prompt tokens in one forward call.

        The oldest prefilling requests form a group of ``k`` rows that each get the same number
        ``L = min(shortest remaining prompt, prefill_chunk // k)`` of new tokens, so the chunk is a
        dense ``[k, L]`` batch (rows may have different cached lengths; the cache masks per row).
        Any split of a prompt gives the same logits, so the grouping never changes an output. With
        prefix reuse the chunk ends where a snapshot is wanted (``PrefixCache.chunk``), snapshots are
        stored, and requests that wait for an older one to compute their shared prefix sit out.
        """
        cs = self.cfg.prefill_chunk
        ready = self._prefilling if self.prefix is None else self.prefix.ready(self._prefilling)
        group = ready[: max(1, cs // _MIN_PREFILL_ROW)]
        L = min(min(len(r.prompt_ids) - r.n_fed for r in group), max(1, cs // len(group)))
        if self.prefix is not None and group[0].block_hashes:
            L = self.prefix.chunk(group[0], L)
        x = torch.tensor(
            [r.prompt_ids[r.n_fed : r.n_fed + L] for r in group], dtype=torch.long, device=self.device
        )  # [k, L]
        emb = chunk_embeds(self.model, [(r.images, r.n_fed, r.n_fed + L) for r in group])  # [n, d] | None
        if len(group) == 1:
            assert group[0].cache is not None
            logits = self._last_logits(x, group[0].cache, emb)  # [1, V]
        else:
            cache = Cache.stack([r.cache for r in group if r.cache is not None])
            logits = self._last_logits(x, cache, emb)  # [k, V]
            for r, c in zip(group, cache.split(), strict=True):
                r.cache = c
        produced = 0
        for i, r in enumerate(group):
            r.n_fed += L
            if self.prefix is not None and r.cache is not None and r.block_hashes:
                self.prefix.store(r.prompt_ids, r.block_hashes, r.cache, r.image_marks)
            if r.n_fed == len(r.prompt_ids):
                if r.images is not None:
                    r.images.release()
                if self.prefix is not None and r.block_hashes:
                    self.prefix.count(r)
                self._prefilling.remove(r)
                self._accept(r, self._choose(r, logits[i]))
                produced += 1
                if r.finish is None:
                    self._joining.append(r)
                else:
                    self._keep_session(r, r.cache)
                    r.cache = None
        return produced

    def _decode_step(self) -> int:
        assert self._batch is not None
        if self.speculator is not None:
            before = sum(len(r.out) for r in self._batch_reqs)
            self._batch, order = self.speculator.step(self._batch_reqs, self._batch, self._emit)
            self._batch_reqs = [self._batch_reqs[i] for i in order]
            return sum(len(r.out) for r in self._batch_reqs) - before
        x = torch.tensor([[r.out[-1]] for r in self._batch_reqs], dtype=torch.long, device=self.device)
        logits = self._last_logits(x, self._batch)  # [B, V]
        greedy_rows = [i for i, r in enumerate(self._batch_reqs) if r.plain_greedy]
        fast = {}
        if greedy_rows:
            idx = torch.tensor(greedy_rows, device=self.device)
            fast = dict(zip(greedy_rows, logits.index_select(0, idx).argmax(-1).tolist(), strict=True))
        for i, r in enumerate(self._batch_reqs):
            self._accept(r, TokenChoice(fast[i]) if i in fast else self._choose(r, logits[i]))
        return len(self._batch_reqs)

    def _last_logits(
        self, x: torch.Tensor, cache: Cache, image_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of the last position of ``x [B, T]`` continuing ``cache``: through the
        speculator when there is a draft (its layers live in the same cache and must see the prompt too),
        else the compiled steps or the eager model (always for a chunk with images); image tokens banned."""
        if self.speculator is not None or self.compiled is None or image_embeds is not None:
            if self.compiled is not None:  # a shape-static model writes latents into reserved room
                cache.reserve(x.shape[1])
            logits = self._forward(x, cache, image_embeds)[:, -1]
        else:
            logits = self.compiled(x, cache)[:, -1]
        return logits if self._banned is None else logits.index_fill(-1, self._banned, -torch.inf)

    def _emit(self, r: Request, choice: TokenChoice) -> bool:
        self._accept(r, choice)
        return r.finish is None

    def _choose(self, r: Request, logits: torch.Tensor) -> TokenChoice:
        if r.plain_greedy:
            return TokenChoice(int(torch.argmax(logits)))
        assert r.sampler is not None
        return sample(logits, r.sampler)

    def _keep_session(self, r: Request, cache: Cache | None) -> None:
        """A finished session request leaves its row (which has seen all but its last token) behind."""
        if r.session is not None:
            self.sessions.keep(r.session, cache if r.finish in ("stop", "length") else None)

    def _rebuild_batch(self) -> None:
        keep = [i for i, r in enumerate(self._batch_reqs) if r.finish is None]
        if len(keep) < len(self._batch_reqs):
            for i, r in enumerate(self._batch_reqs):
                if r.finish is not None and r.session is not None and self._batch is not None:
                    self._keep_session(r, self._batch.select([i]))
            self._batch_reqs = [self._batch_reqs[i] for i in keep]
            self._batch = self._batch.select(keep) if keep and self._batch is not None else None
        if self._joining:
            parts = ([self._batch] if self._batch is not None else []) + [r.cache for r in self._joining]
            self._batch = Cache.stack(parts)  # type: ignore[arg-type]
            self._batch_reqs += self._joining
            for r in self._joining:
                r.cache = None
            self._joining = []

    # ------------------------------------------------------------------ per-token bookkeeping
    def _accept(self, r: Request, choice: TokenChoice) -> None:
        """Record a token (``Request.record``: stop conditions, the safe text delta); finish if done."""
        reason, delta = r.record(choice, self.max_context)
        lp = [choice.logprob] if choice.logprob is not None else None
        if reason is None:
            r.sink(Event(delta, [choice.token], lp))
        else:
            self._finish(r, reason, delta, [choice.token], lp)

    def _finish(
        self,
        r: Request,
        reason: str,
        delta: str = "",
        new: list[int] | None = None,
        lp: list[float] | None = None,
        error: str | None = None,
    ) -> None:
        self.budget.release(r.id)
        if r.session is not None:  # before the result is delivered: the caller may continue at once
            if reason in ("stop", "length"):  # a cancelled or failed turn leaves the context unchanged
                r.session.tokens = r.prompt_ids + r.out
                r.session.images = list(r.images.patches) if r.images is not None else []
                r.session.turns += 1
            r.session.active = False
        self.finished[reason] += 1
        try:
            r.sink(Event(delta, new or [], lp, r.complete(reason, error)))
        except Exception:  # a consumer that went away must not break the scheduler
            log.exception("request %d: delivering the result failed", r.id)

    def _fail_all(self, error: str, reason: str = "error") -> None:
        with self._cv:
            self._waiting.extend(self._incoming)
            self._incoming.clear()
        for r in list(self._waiting) + self._prefilling + self._joining + self._batch_reqs:
            if r.finish is None:
                self._finish(r, reason, error=error)
        self._waiting.clear()
        self._prefilling, self._joining, self._batch_reqs, self._batch = [], [], [], None
        self.cache_bytes_in_use = 0
