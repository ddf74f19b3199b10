"""``--compile``: the engine's decode step under ``torch.compile``, with the same tokens.

A tiny-model decode step is ~2,000 small ops; eager PyTorch pays Python and dispatch overhead on each.
Compiled, the step is a handful of fused kernels (inductor's C++ on CPU; on CUDA also CUDA graphs,
mode ``"reduce-overhead"``). What makes that possible without graph breaks or a recompile per token:

- the model runs shape-static (``LongMoE.set_static_shapes``): MLA writes each row's latent at its own
  position and attends over the whole reserved buffer with a mask (no host read of the lengths),
  routing has no data-dependent branch, and decode-sized MoE batches run their chosen experts in one
  custom op (``ops/moe/decode.py``, ``ops/quant.py`` for packed experts), opaque to dynamo;
- on CPU a graph pass (``gemv_pass.py``) turns the ``B == 1`` graph's fp32 and int8 matrix-vector
  products into inductor reductions that use every thread (BLAS's one-row kernel uses one), and the
  ``B == 1`` step traces its routed experts as the same kind of reduction (``ops/moe/reduce.py``);
- before every call ``Cache.reserve`` sets the latent capacity to a bucket (``capacity_bucket``), and the
  capacity (and, for ``B >= 2``, the batch) is marked symbolic *before* the first compile, so a
  growing context or a changing batch never compiles again: exactly two decode graphs, ``B == 1``
  (dynamo specializes size 1) and ``B >= 2``, each compiled at its first use. (Padding batches up
  to static buckets would copy every row's cache at each step; a symbolic batch costs nothing.)

Only decode is compiled. Prefill stays eager: its MoE dispatch is data-dependent (a graph break per
MoE layer, one recompile per prompt length until dynamo's limit silently sends it back to eager), it
cost minutes of inductor builds, and a prefill chunk is already large ops (docs/serve.md measures it).

Compile cost is visible and cached: each compile is logged at INFO with its seconds (``report()`` and
``Engine.stats()`` carry them, and ``recompiles``: compiles of a graph kind already compiled, which the
tests require to stay 0); inductor's on-disk caches (FX graph + AOTAutograd) live in a stable per-user
directory (``cache_dir``), so a second process skips the C++ builds, and on CPU each step is saved whole
(``precompiled.py``: ``aot_compile``, guards and code) so a second process skips dynamo's tracing too.
``warmup(background=True)`` compiles in a thread while the engine serves: until a graph is ready its
calls run the same model eagerly.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from longmoe.cache import Cache
from longmoe.model import LongMoE
from longmoe.serve.gemv_pass import OneRowGemv
from longmoe.serve.precompiled import PrecompiledStore, artifact_key

logger = logging.getLogger(__name__)
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def cache_dir() -> Path:
    """Inductor's on-disk cache: ``$TORCHINDUCTOR_CACHE_DIR`` if the user set it, else ``$XDG_CACHE_HOME``
    (or ``~/.cache``) ``/longmoe/inductor``: per user and surviving reboots. (Importing inductor's
    config sets the variable to torch's default under /tmp, so that value counts as unset.)"""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    env = os.environ.get(CACHE_ENV)
    if env and Path(env).resolve() != Path(default_cache_dir()).resolve():
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "longmoe" / "inductor"


def use_cache_dir() -> Path:
    """Point inductor at ``cache_dir()`` with its local caches (FX graph, AOTAutograd) on."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.utils import clear_caches

    path = cache_dir()
    if os.environ.get(CACHE_ENV) != str(path):
        os.environ[CACHE_ENV] = str(path)
        clear_caches()  # in-memory lookups keyed by the old directory, as torch's own switch does
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return path


def _decode_logits(model: LongMoE, x: torch.Tensor, cache: Cache) -> torch.Tensor:
    return model(x, cache=cache).logits  # [B, 1, V]


def _graphs() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def _mark_symbolic(x: torch.Tensor, cache: Cache) -> None:
    """Declare the shapes that vary symbolic before dynamo sees them (else the first change recompiles):
    the latent capacity (dim 1 of a growing state's buffer) and, for ``B >= 2``, the batch dim."""
    batch = x.shape[0] >= 2
    if batch:
        torch._dynamo.maybe_mark_dynamic(x, 0)
        torch._dynamo.maybe_mark_dynamic(cache.seq_lens, 0)
    for st in cache.layers:
        for f in dataclasses.fields(st):  # type: ignore[arg-type]
            t = getattr(st, f.name)
            if not isinstance(t, torch.Tensor):
                continue
            if batch:
                torch._dynamo.maybe_mark_dynamic(t, 0)
            if st.forgets and t.dim() == 3:  # a per-token state's [B, capacity, width] buffer
                torch._dynamo.maybe_mark_dynamic(t, 1)


def _guard_failure(step: Any, *args: Any) -> str:
    """The first failed guard of an ``aot_compile``'d step, for the log."""
    try:
        info = step._artifacts.guard_manager.check_verbose(step.prepare_f_locals(*args))
        return "; ".join(info.verbose_code_parts)[:300]
    except Exception as e:  # noqa: BLE001 - only a log line: torch's private API may move
        return f"reason unavailable: {type(e).__name__}"


class CompiledSteps:
    """``steps(x [B, T], cache) -> logits [B, 1, V]`` of the last position; decode compiled, prefill eager."""

    def __init__(self, model: LongMoE, backend: str = "inductor") -> None:
        self.model = model
        self.backend = backend
        model.set_static_shapes(True)
        cuda = next(model.parameters()).device.type == "cuda"
        inductor = backend == "inductor"
        mode = "reduce-overhead" if cuda and inductor else None
        # CPU: one-row fp32 linears as threaded inductor reductions, not 1-thread BLAS (gemv_pass.py)
        options = {"post_grad_custom_post_pass": OneRowGemv()} if inductor and not cuda else None
        self.cache_path = use_cache_dir() if inductor else None
        self._decode = torch.compile(
            _decode_logits, backend=backend, mode=mode, options=options, fullgraph=True
        )
        # CPU inductor: whole steps saved and loaded by aot_compile (precompiled.py); elsewhere (CUDA
        # graphs, test backends) dynamo's in-process compile only
        self._store = PrecompiledStore(cache_dir() / "precompiled") if inductor and not cuda else None
        self._options = f"mode={mode};gemv={options is not None}"
        self._steps: dict[str, Any] = {}  # graph kind -> a loaded or aot-compiled step
        self.precompiled_loads = 0  # graph kinds loaded from disk instead of compiled
        self.compile_seconds = 0.0  # wall time of calls that compiled
        self.compiles: dict[str, float] = {}  # graph kind -> seconds its compile took
        self.recompiles = 0  # compiles of a kind already compiled (a guard failed): must stay 0
        self._lock = threading.Lock()  # one compile at a time (warm-up thread vs the engine's thread)
        self._warmup: threading.Thread | None = None

    @staticmethod
    def kind(B: int) -> str:
        return "decode B=1" if B == 1 else "decode B>=2"

    def ready(self, B: int) -> bool:
        return self.kind(B) in self.compiles

    def __call__(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        T, B = x.shape[1], x.shape[0]
        cache.reserve(T)
        if T > 1:  # prefill: eager (module docstring), on the eager layout and paths (layers/shapes.py)
            with self.model.dynamic_shapes():
                return self.model(x, cache=cache, logits_to_keep=1).logits
        if not self._warmup_done():  # compiling in the background: the same step eagerly meanwhile
            return _decode_logits(self.model, x, cache)
        with self._lock:
            return self._run(self.kind(B), x, cache)

    def _warmup_done(self) -> bool:
        return self._warmup is None or not self._warmup.is_alive()

    def _run(self, kind: str, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        if self._store is not None and kind not in self.compiles:
            self._precompile(kind, x, cache)
        step = self._steps.get(kind)
        if step is not None:  # its symbolic dims are in its graph: no marking (a loaded step's guards
            # expect none, so a marked tensor would fail them)
            if step.guard_check(self.model, x, cache):
                return step(self.model, x, cache)
            # outside what the step was compiled for (e.g. called outside inference mode): dynamo's
            # in-process compile from here on (counted as a recompile there: the kind was compiled)
            self._steps.pop(kind)
            why = _guard_failure(step, self.model, x, cache)
            logger.warning("torch.compile: %s precompiled guards failed (%s); compiling here", kind, why)
        _mark_symbolic(x, cache)
        before = _graphs()
        t0 = time.perf_counter()
        out = self._decode(self.model, x, cache)
        new = _graphs() - before
        if new:
            dt = time.perf_counter() - t0
            self.compile_seconds += dt
            if kind in self.compiles:
                self.recompiles += new
                logger.warning("torch.compile: %s compiled again (%d graph(s), %.1f s)", kind, new, dt)
            else:
                self.compiles[kind] = dt
                where = f", cache {self.cache_path}" if self.cache_path else ""
                logger.info("torch.compile: %s compiled in %.1f s (%s%s)", kind, dt, self.backend, where)
        return out

    def _precompile(self, kind: str, x: torch.Tensor, cache: Cache) -> None:
        """Load ``kind``'s step from the store, else ``aot_compile`` it (as dynamo would, plus the
        guards and code in one file) and save it; on failure leave it to the in-process compile."""
        assert self._store is not None
        key = artifact_key(self.model, self.backend, self._options, kind)
        t0 = time.perf_counter()
        step = self._store.load(key, self.model)
        loaded = step is not None
        if step is None:
            _mark_symbolic(x, cache)
            try:
                step = self._decode.aot_compile(((self.model, x, cache), {}))
            except Exception as e:  # noqa: BLE001 - the in-process compile still works
                logger.warning("torch.compile: %s not precompiled (%s: %s)", kind, type(e).__name__, e)
                self._store = None
                return
            self._store.save(key, step, self.model)
        step.disable_guard_check()  # checked in _run, where a failure falls back instead of raising
        dt = time.perf_counter() - t0
        self._steps[kind] = step
        self.compiles[kind] = dt
        self.compile_seconds += dt
        self.precompiled_loads += loaded
        how = "loaded precompiled" if loaded else "compiled and saved"
        logger.info("torch.compile: %s %s in %.1f s (%s)", kind, how, dt, self._store.path(key))

    def warmup(self, batch_sizes: tuple[int, ...] = (1, 2), background: bool = False) -> float:
        """Compile the decode graphs ahead of requests (``B == 1`` and ``B >= 2``). Returns the seconds
        (0 when started in the ``background``: calls run eagerly until it finishes)."""
        if background:
            self._warmup = threading.Thread(
                target=self._compile_all, args=(batch_sizes,), name="longmoe-compile", daemon=True
            )
            self._warmup.start()
            return 0.0
        return self._compile_all(batch_sizes)

    def _compile_all(self, batch_sizes: tuple[int, ...]) -> float:
        t0 = time.perf_counter()
        dev = self.model.embed.weight.device
        with torch.inference_mode(), self._lock:
            for B in batch_sizes:
                if not self.ready(B):
                    cache = self.model.new_cache(B, dev)
                    x = torch.zeros(B, 1, dtype=torch.long, device=dev)
                    cache.reserve(1)
                    self._run(self.kind(B), x, cache)
        return time.perf_counter() - t0

    def join(self, timeout: float | None = None) -> None:
        """Wait for a background warm-up."""
        if self._warmup is not None:
            self._warmup.join(timeout)

    def report(self) -> dict[str, float]:
        """For ``Engine.stats()``: seconds spent compiling, graphs compiled, recompiles (should be 0)."""
        return {
            "compile_seconds": self.compile_seconds,
            "compiled_graphs": len(self.compiles),
            "recompiles": self.recompiles,
            "precompiled_loads": self.precompiled_loads,
            "compile_warming_up": int(not self._warmup_done()),
        }


def announce(steps: CompiledSteps, background: bool) -> str:
    """The CLI's start-up line for ``--compile``; also sends this module's INFO log (each compile and
    its seconds) to stderr."""
    if not any(getattr(h, "_longmoe", False) for h in logger.handlers):
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(message)s"))
        h._longmoe = True  # type: ignore[attr-defined]
        logger.addHandler(h)
        logger.setLevel(logging.INFO)
    when = "in the background (eager steps until ready)" if background else "at the first decode step"
    where = f"; cache {steps.cache_path}" if steps.cache_path else ""
    return f"--compile: decode step (B=1, B>=2) compiled {when}; prefill eager{where}"
