"""Where a batch-1 decode step's CPU time goes: per part of the model, at a short and a long cache.

``bench/long_context.py decode`` puts a step's CPU time beside its floor (bytes / bandwidth). This
profile says what the rest is: the tiny preset (fp32, random weights, 1 thread) continues a
**synthesised** cache (``long_context.synth_cache``) of each length, and every call of the parts below
is timed in CPU time, each part *exclusive* of the parts it calls (the MoE layer without its shared
expert's GLU, the MLA layer without its attention call, a block without its mixer and FFN):

- ``KDA mixer``, ``MLA mixer (around the attention)``, ``MLA attention (latent_attention)``;
- ``MoE FFN`` (router, routing, the chosen experts; its shared expert is the ``dense GLU`` row) and
  ``dense GLU`` (the first layer's FFN and every shared expert);
- ``block attention residuals`` (mixing and keys), ``block (norms, adds)`` (a block's own work: its two
  pre-norms), ``model (embed, head, cache)`` (the rest of the forward).

The timers cost host time themselves (a few µs a call), so the parts sum to more than a plain step; the
plain step's CPU time is measured beside them, and the ATen calls of one step are counted (a
``TorchDispatchMode``: every op the Python side dispatches). Rounds alternate the lengths.

    python -m bench.decode_profile --rounds 3
    python -m bench.decode_profile --quick      # 4K, one round of 4 steps (a smoke run)
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.common import counted_spread, markdown_table, write_results
from bench.long_context import synth_cache
from bench.long_context_base import K, load, tiny_model
from longmoe import model as model_mod
from longmoe.layers import attnres, kda, mla, mlp, moe

LENGTHS = [4 * K, 1024 * K]
MODEL = "model (embed, head, cache)"
# (owner, attribute, part): each is timed exclusive of the others it calls
PARTS = [
    (model_mod.LongMoE, "forward", MODEL),
    (model_mod.Block, "mix", "block (norms, adds)"),
    (model_mod.Block, "feed", "block (norms, adds)"),
    (kda.KDALayer, "forward", "KDA mixer"),
    (mla.MLALayer, "forward", "MLA mixer (around the attention)"),
    (mla, "latent_attention", "MLA attention (latent_attention)"),
    (moe.MoELayer, "forward", "MoE FFN"),
    (mlp.GLUMLP, "forward", "dense GLU"),
    (attnres.BlockAttnRes, "forward", "block attention residuals"),
    (attnres.BlockAttnRes, "keys", "block attention residuals"),
]


class _Timers:
    """Exclusive CPU time per part: a call's time minus the time of the timed calls inside it."""

    def __init__(self) -> None:
        self.acc: collections.Counter[str] = collections.Counter()
        self.stack: list[float] = []  # time spent in timed children of each open call

    def wrap(self, fn: Callable, part: str) -> Callable:
        def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            self.stack.append(0.0)
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.process_time() - c0
                inner = self.stack.pop()
                self.acc[part] += spent - inner
                if self.stack:
                    self.stack[-1] += spent

        return timed


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.n += 1
        return func(*args, **(kwargs or {}))


@torch.inference_mode()
def run(lengths: list[int], rounds: int, steps: int) -> dict:
    model = tiny_model()
    x = torch.tensor([[5]])
    plain = {n: [] for n in lengths}
    parts = {n: collections.defaultdict(list) for n in lengths}
    calls = {}
    for r in range(rounds):
        for n in lengths:
            cache = synth_cache(model, n, room=3 * steps + 8, seed=n + r)
            model(x, cache=cache, logits_to_keep=1)  # warm-up
            c0 = time.process_time()
            for _ in range(steps):
                model(x, cache=cache, logits_to_keep=1)
            plain[n].append((time.process_time() - c0) / steps * 1e3)
            timers = _Timers()
            saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in PARTS]
            try:
                for (owner, attr, fn), (_, _, part) in zip(saved, PARTS, strict=True):
                    setattr(owner, attr, timers.wrap(fn, part))
                for _ in range(steps):
                    model(x, cache=cache, logits_to_keep=1)
            finally:
                for owner, attr, fn in saved:
                    setattr(owner, attr, fn)
            for part in dict.fromkeys(p for _, _, p in PARTS):
                parts[n][part].append(timers.acc[part] / steps * 1e3)
            counter = _CountOps()
            with counter:
                model(x, cache=cache, logits_to_keep=1)
            calls[n] = counter.n
            print("profile", r, n, round(plain[n][-1], 3), {k: round(v[-1], 3) for k, v in parts[n].items()})
            del cache
    return {
        "rows": {
            n: {
                "step_cpu_ms": counted_spread(plain[n]),
                "aten_calls": calls[n],
                "parts_cpu_ms": {k: counted_spread(v) for k, v in parts[n].items()},
            }
            for n in lengths
        },  # fmt: skip
        "steps": steps,
        "threads": torch.get_num_threads(),
        "load_avg": load(),
        "model": "tiny preset, random weights, fp32",
        "cache": "synthesised (random latents and KDA states; speed does not depend on content)",
        "timing": "CPU time of the process; parts exclusive of the timed parts they call",
    }


def table(res: dict) -> str:
    lengths = list(res["rows"])
    header = ["part"] + [f"CPU ms/step at {int(n) // K}K [min, max]" for n in lengths]
    first = res["rows"][lengths[0]]["parts_cpu_ms"]
    body = []
    for part in first:
        cells = [res["rows"][n]["parts_cpu_ms"][part] for n in lengths]
        body.append([part] + [f"{c['median']:.3f} [{c['min']:.3f}, {c['max']:.3f}]" for c in cells])
    sums = [sum(res["rows"][n]["parts_cpu_ms"][p]["median"] for p in first) for n in lengths]
    body.append(["sum of the parts (timers included)"] + [f"{s:.3f}" for s in sums])
    steps = [res["rows"][n]["step_cpu_ms"] for n in lengths]
    body.append(
        ["a step without timers"] + [f"{c['median']:.3f} [{c['min']:.3f}, {c['max']:.3f}]" for c in steps]
    )
    body.append(["ATen calls per step"] + [res["rows"][n]["aten_calls"] for n in lengths])
    return markdown_table(header, body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default=None, help="comma-separated cached lengths (4096,1048576)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    p.add_argument("--steps", type=int, default=16, help="decode steps per sample (16)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 4K only, 1 round of 4 steps")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lengths = [int(v) for v in args.lengths.split(",")] if args.lengths else LENGTHS
    if args.quick:
        lengths, args.rounds, args.steps = [4 * K], 1, 4
    t0 = time.process_time()
    res = run(lengths, args.rounds, args.steps)
    res["cpu_seconds"] = time.process_time() - t0
    md = (
        f"Where a decode step's CPU time goes (tiny preset, fp32, synthesised cache, {res['threads']} "
        f"thread under contention, {args.rounds} alternating rounds of {args.steps} steps; each part "
        "exclusive of the timed parts it calls):\n\n" + table(res)
    )
    write_results("decode_profile", res, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
