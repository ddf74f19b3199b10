"""The inference engine: the public API, and the loop that runs steps (in the waiting caller, or a thread).

As vLLM's engine core, a thin loop over two parts: the **scheduler** (``serve/scheduler.py``: queues,
admission against the ``CacheBudget``, prefix reuse, sessions, cancellation; no tensors) plans each
step, the **model runner** (``serve/runner.py``: prefill chunks, batched decode, compiled steps,
speculation, banned tokens, sampling) runs it. A step goes one way (``serve/step.py``):
``plan = scheduler.schedule()`` (submissions, cancellations, admission in arrival order),
``output = runner.execute(plan)`` (rows leave, one batched decode step for every running row, one
prefill chunk shared by the oldest prefilling requests: a completed prompt gets its first token and
joins the batch, finished rows leave it), ``scheduler.update(plan, output)`` (the output processor's
text and stop strings, events, finishing, snapshots and sessions' rows).
Tokenisation (``encode_prompt``, ``encode_chat``) and building the ``Request`` happen here, on the
caller's thread. Prefix reuse, speculative decoding, sessions and images never change greedy outputs.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import fields
from pathlib import Path

import torch

from longmoe.checkpoint import load_model
from longmoe.data.chat import encode_chat, render_messages
from longmoe.data.images import image_span
from longmoe.data.tokenizer import Tokenizer
from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from longmoe.quantize import quantize_model
from longmoe.serve.budget import CacheBudget, CacheSpec
from longmoe.serve.compiled import CompiledSteps
from longmoe.serve.engine_config import EngineConfig
from longmoe.serve.errors import EngineError
from longmoe.serve.output import OutputProcessor
from longmoe.serve.prefix_policy import PrefixPolicy
from longmoe.serve.prefix_store import SnapshotStore
from longmoe.serve.prompt_images import check_images, image_token_ids
from longmoe.serve.request import Completion, Event, Request, RequestHandle, check_ids, check_lengths
from longmoe.serve.runner import ModelRunner
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.scheduler import Scheduler
from longmoe.serve.session import Session

log = logging.getLogger(__name__)


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
            quantize_model(model, self.cfg.quantize, head=self.cfg.quantize_head)  # in place
        self.tokenizer = tokenizer
        self.vocab_size = model.cfg.vocab_size
        if tokenizer.vocab_size > self.vocab_size:
            raise ValueError(
                f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is {self.vocab_size}"
            )
        c = self.cfg
        banned = image_token_ids(model, tokenizer)  # a vision model must never generate an image token
        self.runner = ModelRunner(
            model,
            compile=c.compile,
            draft=draft,
            num_speculative_tokens=c.num_speculative_tokens,
            banned=banned,
        )
        self.model, self.device = self.runner.model, self.runner.device
        if self.runner.compiled is not None and c.compile_warmup:  # serve eagerly while it compiles
            self.runner.compiled.warmup(background=True)
        self.speculator = self.runner.speculator
        self.spec = CacheSpec.of_cache(self.runner.new_cache())
        self.budget = CacheBudget(self.spec, c.cache_budget_bytes, c.block_size)
        # prefix reuse: the snapshot store, and the policy that admits requests against it; prefill
        # records chunk states inside its calls unless compiled (a side effect in the graph)
        self.prefix = SnapshotStore(self.budget, c.prefix_block_size, self.device) if c.prefix_cache else None
        policy = None if self.prefix is None else PrefixPolicy(self.prefix, record_states=not c.compile)
        self.runner.record_states = self.prefix is not None
        self.outputs = OutputProcessor(tokenizer)
        self.scheduler = Scheduler(
            self.budget,
            self.runner.new_cache,
            max_batch=c.max_batch,
            max_waiting=c.max_waiting,
            prefill_chunk=c.prefill_chunk,
            max_context=self.max_context,
            prefix=policy,
            outputs=self.outputs,
        )
        self.sessions = self.scheduler.sessions
        self.counters, self.finished = self.scheduler.counters, self.scheduler.finished
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._step_lock = threading.Lock()  # one step at a time: the engine thread or a pumping caller
        self._stepping: int | None = None  # the thread inside a step (its sinks must not pump)
        self._driven = 0  # open ``driven_here`` blocks: their sink requests start no engine thread
        self.cache_bytes_in_use = 0

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
    def compiled(self) -> CompiledSteps | None:
        """The runner's compiled steps (``--compile``); assignable, e.g. to pick a backend."""
        return self.runner.compiled

    @compiled.setter
    def compiled(self, steps: CompiledSteps | None) -> None:
        self.runner.compiled = steps

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
            text = render_messages(messages, add_generation_prompt=True, tools=tools)
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
        cache_salt: bytes | None = None,
    ) -> RequestHandle:
        """Queue a request; events go to ``sink`` (called from the engine thread) or the handle.

        With a ``session`` (``open_session``) the prompt is only what is new since the session's last
        request (its whole context and kept cache row are reused; see ``serve/session.py``).
        ``images``: the ``Patches`` of the prompt's image spans in order (a text prompt gets them in
        front, ``encode_prompt``); see ``serve/prompt_images.py``. ``cache_salt``: prefix snapshots are
        shared only by requests with the same salt (vLLM's ``cache_salt``: one per API key)."""
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
        tok, rid = self.tokenizer, next(self._ids)
        ends = (tok.eos_id, tok.end_id)
        req = Request.new(
            rid,
            ids,
            params,
            sink,
            ends,
            self.vocab_size,
            self.device,
            session,
            prompt_images,
            self.max_context,
        )
        req.salt = cache_salt
        with self.scheduler.cv:  # one thread starts, however many callers submit at once
            self.scheduler.add(req)
            if q is None and not self._driven:  # a sink's events must flow without its caller
                self._ensure_thread()
        return RequestHandle(req, q, self.scheduler.cancel, self.pump)

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        session: Session | None = None,
        images: Sequence[Patches] = (),
    ) -> Completion:
        return self.submit(prompt, params, session=session, images=images).result()

    def forget_prefix(self, salt: bytes) -> int:
        """Drop every prefix snapshot stored under ``cache_salt`` ``salt`` (a deleted file's
        questions); between steps, so no step sees it half done. The number of snapshots dropped."""
        if self.prefix is None:
            return 0
        with self._step_lock:
            return self.prefix.forget(salt)

    def open_session(self) -> Session:
        """A new conversation whose requests continue one another on a kept cache row."""
        return Session()

    def close_session(self, session: Session) -> None:
        """Release the session's kept row (after its running request, if any, finishes)."""
        self.scheduler.close_session(session)
        self.pump()  # without an engine thread, release the row now

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
        return {
            **self.counters,
            **{f"finished_{k}": v for k, v in self.finished.items()},
            "waiting": self.scheduler.n_waiting,
            "running": self.scheduler.n_running,
            "cache_bytes_in_use": self.cache_bytes_in_use,
            "cache_bytes_reserved": self.budget.reserved_bytes,
            "cache_budget_bytes": self.budget.budget,
            "tokens_per_second": self.scheduler.tokens_per_second(),
            **(self.prefix.report() if self.prefix is not None else {}),
            **self.sessions.report(),
            **(self.speculator.report() if self.speculator is not None else {}),
            **(self.compiled.report() if self.compiled is not None else {}),
        }

    def weights_changed(self) -> None:
        """The served module's weights were updated in place (an RL update): drop the prefix
        snapshots, whose states were computed with the old weights."""
        if self.prefix is not None:
            self.prefix.clear()

    def stop(self) -> None:
        """End the loop (``run_forever`` or the engine thread's) without waiting for it; safe from a
        signal handler or another thread. Requests still queued end as cancelled."""
        self.scheduler.close()

    def close(self) -> None:
        self.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        if not self._worker_alive():
            with self._step_lock:  # requests no caller waited for end here, as the thread's loop ends them
                self._fail_all("engine closed", reason="cancelled")

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ who runs the steps
    # A caller waiting on its handle runs the steps itself (``pump``) unless the engine thread runs:
    # then the model computes in the thread that built it. With PyTorch's OpenMP (libgomp) every
    # thread that runs parallel ops gets its own pool; once the process has more pool threads than
    # cores, libgomp stops spinning between parallel regions and each one pays a futex wake-up
    # (~30 µs): the 0.3B model's 1K prefill took 5.9 s in a second thread vs 3.2 s in the one that
    # built it (docs/serve.md). The engine thread is started only for sink submissions, whose events
    # must flow with no caller waiting, and only if no thread runs ``run_forever`` (``longmoe serve``
    # runs it on the main thread, where the model was loaded).
    def _worker_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @contextlib.contextmanager
    def driven_here(self) -> Iterator[None]:
        """Sink requests submitted inside the block start no engine thread: the caller runs their steps
        with ``pump()`` while it waits (the agent rollouts: many sinks, one waiting loop, in the thread
        that trains). On leaving, work still queued goes to the engine thread."""
        with self.scheduler.cv:
            self._driven += 1
        try:
            yield
        finally:
            with self.scheduler.cv:
                self._driven -= 1
                if not self._driven and self.scheduler.has_work():
                    self._ensure_thread()

    def pump(self) -> bool:
        """Run one step in the calling thread if no engine thread runs and there is work; False if not
        (then the caller waits for its events)."""
        if self._worker_alive() or self._stepping == threading.get_ident():  # (a sink inside a step)
            return False
        with self._step_lock:
            if self._worker_alive() or self.scheduler.closed or not self.scheduler.has_work():
                return False
            with torch.inference_mode():
                self._safe_step()
        return True

    def run_forever(self) -> None:
        """Run the steps in the calling thread until ``stop()`` (from another thread or a signal
        handler): ``longmoe serve`` gives the engine its main thread, where the model was loaded, and
        runs the HTTP server on another. Sink requests then need no engine thread."""
        with self.scheduler.cv:
            if self._worker_alive():
                raise RuntimeError("the engine's steps already run on another thread")
            self._thread = threading.current_thread()
        try:
            self._loop()
        finally:
            self._thread = None

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="longmoe-engine", daemon=True)
            self._thread.start()
            ref = weakref.ref(self)
            atexit.register(lambda: (e := ref()) is not None and e.close())

    def _loop(self) -> None:
        with torch.inference_mode():
            while self.scheduler.wait_for_work():
                with self._step_lock:
                    self._safe_step()
            with self._step_lock:
                self._fail_all("engine closed", reason="cancelled")

    def _safe_step(self) -> None:
        self._stepping = threading.get_ident()
        try:
            self.step()
        except Exception as e:  # a failing step must not kill the engine: fail its requests
            log.exception("engine step failed")
            self._fail_all(f"{type(e).__name__}: {e}")
        finally:
            self._stepping = None

    def step(self) -> None:
        """One iteration, one way (see the module docstring); engine thread."""
        plan = self.scheduler.schedule()
        output = self.runner.execute(plan)
        self.scheduler.update(plan, output)
        self.cache_bytes_in_use = self.scheduler.held_bytes() + self.runner.batch_bytes()

    def _fail_all(self, error: str, reason: str = "error") -> None:
        self.scheduler.fail_all(error, reason)
        self.runner.reset()
        self.cache_bytes_in_use = 0
