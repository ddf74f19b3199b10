"""``--compile``: the engine's model steps under ``torch.compile``, with the same tokens.

A tiny-model decode step is ~2,000 small ops; eager PyTorch pays Python and dispatch overhead on each.
Compiled, the step is a handful of fused kernels (inductor's C++ on CPU; on CUDA also CUDA graphs,
mode ``"reduce-overhead"``). What makes that possible without graph breaks or a recompile per token:

- the model runs shape-static (``LongMoE.set_static_shapes``): MLA writes each row's latent at its own
  position and attends over the whole reserved buffer with a mask (no host read of the lengths),
  routing has no data-dependent branch, and decode-sized MoE batches gather their experts' weights;
- before every call ``Cache.reserve`` sets the latent capacity to a power-of-two bucket, so a growing
  context changes the shape only when it crosses a bucket, and a changed batch only when it
  changes ``B``. Dynamo's automatic dynamic shapes then makes those dimensions symbolic after the
  first change, so the number of compilations stays a small constant (counted by the tests through
  ``torch._dynamo``'s counters).

Decode (``T == 1``) and prefill (``T > 1``) are separate compiled functions (separate caches of
compiled code; on CUDA prefill stays eager, see ``CompiledSteps``): decode is captured whole
(``fullgraph=True``; a quantized model's experts break it once per MoE layer, see
longmoe/quantize.py); prefill is compiled with dynamic shapes and breaks its graph around the
data-dependent MoE dispatch (its tier layout depends on the routing).
Compilation happens at the first call of each shape class (``warmup`` does it ahead of requests).
"""

from __future__ import annotations

import time

import torch

from longmoe.cache import Cache
from longmoe.model import LongMoE


def _decode_logits(model: LongMoE, x: torch.Tensor, cache: Cache) -> torch.Tensor:
    return model(x, cache=cache).logits  # [B, 1, V]


def _prefill_logits(model: LongMoE, x: torch.Tensor, cache: Cache) -> torch.Tensor:
    return model(x, cache=cache).logits[:, -1:]  # [B, 1, V]: only the last position is sampled


class CompiledSteps:
    """``steps(x [B, T], cache) -> logits [B, 1, V]`` of the last position, compiled per step kind."""

    def __init__(self, model: LongMoE, backend: str = "inductor") -> None:
        self.model = model
        model.set_static_shapes(True)
        cuda = next(model.parameters()).device.type == "cuda"
        mode = "reduce-overhead" if cuda and backend == "inductor" else None
        # quantized experts loop over the active experts on the host: a graph break per MoE layer
        whole = not getattr(model, "quantization", None)
        self._decode = torch.compile(_decode_logits, backend=backend, mode=mode, fullgraph=whole)
        # On CUDA a prefill chunk is already a few large kernels, and compiling its dynamic-shape graph
        # takes minutes: only decode is compiled there (and captured in CUDA graphs).
        self._prefill = (
            _prefill_logits if cuda else torch.compile(_prefill_logits, backend=backend, dynamic=True)
        )
        self.compile_seconds = 0.0  # wall time of calls that compiled (first call of a shape class)
        self._seen: set[tuple[str, int, int]] = set()

    def __call__(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        T = x.shape[1]
        cap = cache.reserve(T)
        fn = self._decode if T == 1 else self._prefill
        key = ("decode" if T == 1 else "prefill", min(x.shape[0], 2), cap if T == 1 else 0)
        if key in self._seen:
            return fn(self.model, x, cache)
        t0 = time.perf_counter()
        out = fn(self.model, x, cache)
        self.compile_seconds += time.perf_counter() - t0
        self._seen.add(key)
        return out

    def warmup(self, batch_sizes: tuple[int, ...] = (1, 2), prefill_len: int = 16) -> float:
        """Compile ahead of requests: prefill once and decode at each batch size. Returns seconds."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            for B in batch_sizes:
                cache = self.model.new_cache(B)
                x = torch.zeros(B, prefill_len, dtype=torch.long, device=cache.seq_lens.device)
                self(x, cache)
                self(x[:, :1], cache)
        return time.perf_counter() - t0
