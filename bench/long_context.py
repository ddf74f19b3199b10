"""Long contexts on a CPU: decode ms/token against the memory floor, and engine prefill by length.

- ``decode``: batch-1 decode ms/token at 4K ... 1M cached tokens on a **synthesised** cache of that
  length (random latents and KDA states written straight into the ``Cache``: a decode step's time
  depends on the cache's length and shapes, not on what it holds, so 1M tokens need no hour-long
  prefill). Against the **floor**: the bytes one decoded token must read (active weights, KDA states,
  MLA latents; ``bench/cpu_floor.py``) over the read bandwidth measured in the same run, with the bytes
  a pure-MLA model (every layer MLA) and a full-MHA model (K and V of every layer) would read beside
  it. Arms: ``split`` (the cached length cut over threads, ``ops/attention/latent.py``) and
  ``one piece`` (the whole prefix in one fused call: what one thread walking the cache costs).
- ``prefill``: a prompt of each length through ``Engine`` (``prefill_chunk`` 4096): TTFT, prefill
  tokens/s, decode ms/token after it, and memory: the rise of peak RSS during the request over RSS
  before it, against the cache bytes ``longmoe inspect`` predicts (bf16) and the same at the run's
  dtype.

Lengths alternate inside each round (round-robin), medians and [min, max] over rounds. This machine is
shared: every timing here is taken under contention from other processes (the JSON records the load).

    python -m bench.long_context decode --rounds 3
    python -m bench.long_context prefill --lengths 4096,16384,65536 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench.common import (
    RESULTS,
    ROOT,
    bench_tokenizer,
    counted_spread,
    markdown_table,
    provenance,
    write_results,
)
from bench.cpu_floor import active_bytes, read_bandwidth, rss_bytes
from bench.long_context_base import (
    CHUNK,
    DECODE_LENGTHS,
    PREFILL_LENGTHS,
    K,
    hwm_reset,
    load,
    merge_rows,
    peak_rss,
    run_label,
    tiny_model,
)
from bench.long_context_http import http_table, run_http
from longmoe.cache import KDAState, MLAState
from longmoe.memory import cache_accounting
from longmoe.model import LongMoE
from longmoe.ops.attention import latent
from longmoe.runtime import release_freed_memory
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplingParams

PLOT = ROOT / "docs" / "figures" / "long_context.png"


# ---------------------------------------------------------------------------------------------- decode
def synth_cache(model: LongMoE, n: int, room: int, seed: int):
    """A one-row cache that has 'seen' ``n`` tokens: random latents (unit RMS, as ``kv_norm`` leaves
    them) and random KDA states, capacity ``n + room``."""
    gen = torch.Generator().manual_seed(seed)
    cache = model.new_cache(1)
    for st in cache.layers:
        if isinstance(st, MLAState):
            buf = torch.zeros(1, n + room, st.buf.shape[2], dtype=st.buf.dtype)
            buf[:, :n] = torch.randn(1, n, st.buf.shape[2], generator=gen)
            st.buf = buf
        elif isinstance(st, KDAState):
            st.state = torch.randn(st.state.shape, generator=gen) * 0.1
            st.conv = torch.randn(st.conv.shape, generator=gen).to(st.conv.dtype)
    cache.seq_lens = torch.tensor([n])
    return cache


def floor_bytes(model: LongMoE, n: int) -> dict:
    """Bytes one decoded token reads at ``n`` cached tokens (the run's dtype), and what a pure-MLA and
    a full-MHA model of the same width and depth would read for their caches."""
    cfg = model.cfg
    b = model.embed.weight.element_size()
    cache = model.new_cache(1)
    kda = sum(st.spec().fixed for st in cache.layers if isinstance(st, KDAState))
    row = cfg.mla_kv_lora_rank + cfg.mla_shared_key_dim
    mla = cfg.layer_types.count("M") * n * row * b
    weights = active_bytes(cfg, "fp32")["total"]
    return {
        "weights": weights,
        "kda_states": kda,
        "mla_latents": mla,
        "total": weights + kda + mla,
        "pure_mla_cache": cfg.n_layers * n * row * b,
        "full_mha_cache": cfg.n_layers * n * 2 * cfg.d_model * b,
    }


@torch.inference_mode()
def decode_ms(model: LongMoE, cache, steps: int) -> tuple[float, float]:
    """Median ``(wall ms, CPU ms)`` of ``steps`` one-token steps continuing ``cache`` (after one warm-up
    step). CPU time is the process's: with one thread, the step's own work whatever else runs."""
    x = torch.tensor([[5]])
    model(x, cache=cache, logits_to_keep=1)
    wall, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        model(x, cache=cache, logits_to_keep=1)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def cpu_bandwidth(gib: float = 0.5, iters: int = 7) -> float:
    """Bytes per CPU-second of summing a ``gib`` GiB fp32 tensor, best of ``iters``: the read bandwidth
    one thread gets when it runs (``read_bandwidth`` in wall time reads low on a loaded machine)."""
    x = torch.ones(int(gib * (1 << 30)) // 4)
    x.sum()
    best = float("inf")
    for _ in range(iters):
        c0 = time.process_time()
        x.sum()
        best = min(best, time.process_time() - c0)
    return x.numel() * 4 / best


def run_decode(lengths: list[int], rounds: int, steps: int) -> dict:
    model = tiny_model()
    bw = [read_bandwidth()]
    bw_cpu = [cpu_bandwidth()]
    arms = {"split": None, "one piece": 1}
    wall = {n: {a: [] for a in arms} for n in lengths}
    cpu = {n: {a: [] for a in arms} for n in lengths}
    loads = []
    for r in range(rounds):
        for n in lengths:  # a fresh cache per round: no round reuses another's warm pages
            cache = synth_cache(model, n, room=2 * steps + 8, seed=n + r)
            for arm, splits in arms.items():
                if splits is not None and n > 256 * K and r > 0:
                    continue  # one round of the slow arm past 256K (seconds a step)
                old = latent.MAX_SPLITS
                latent.MAX_SPLITS = splits or old
                try:
                    w, c = decode_ms(model, cache, steps if splits is None else max(2, steps // 4))
                finally:
                    latent.MAX_SPLITS = old
                wall[n][arm].append(w)
                cpu[n][arm].append(c)
                cache.seq_lens = torch.tensor([n])  # back to n tokens (content is irrelevant to speed)
            loads.append(load())
            print(
                "decode",
                r,
                n,
                {a: (round(wall[n][a][-1], 2), round(cpu[n][a][-1], 2)) for a in arms},
                flush=True,
            )
            del cache
    bw.append(read_bandwidth())
    bw_cpu.append(cpu_bandwidth())
    bandwidth = max(bw_cpu)
    rows = {}
    for n in lengths:
        fb = floor_bytes(model, n)
        floor_ms = fb["total"] / bandwidth * 1e3
        rows[n] = {
            "cpu_ms": {a: counted_spread(v) for a, v in cpu[n].items() if v},
            "wall_ms": {a: counted_spread(v) for a, v in wall[n].items() if v},
            "bytes": fb,
            "floor_ms": floor_ms,
            "ratio": {a: statistics.median(v) / floor_ms for a, v in cpu[n].items() if v},
            "pure_mla_floor_ms": (fb["weights"] + fb["pure_mla_cache"]) / bandwidth * 1e3,
            "full_mha_floor_ms": (fb["weights"] + fb["full_mha_cache"]) / bandwidth * 1e3,
        }
    return {
        "bandwidth_cpu_bytes_per_s": bandwidth,
        "bandwidth_cpu_samples": bw_cpu,
        "bandwidth_wall_samples": bw,
        "rows": rows,
        "load_avg": loads,
        "threads": torch.get_num_threads(),
        "dtype": "float32",
        "model": "tiny preset, random weights",
        "cache": "synthesised (random latents and KDA states; speed does not depend on content)",
        "timing": "CPU time of the process per step (wall time beside: the machine is shared)",
    }


def decode_table(res: dict) -> str:
    header = [
        "cached tokens",
        "CPU ms/token [min, max]",
        "wall ms/token",
        "CPU ms, one piece",
        "floor ms",
        "CPU / floor [min, max]",
        "within 2x",
        "MB read: weights + KDA + latents",
        "pure-MLA floor ms",
        "full-MHA floor ms",
    ]
    rows = []
    for n, r in res["rows"].items():
        s, one = r["cpu_ms"]["split"], r["cpu_ms"].get("one piece")
        n_one = "" if one is None else f"{one['median']:.2f}" + (" (1 sample)" if one["n"] == 1 else "")
        lo, hi = s["min"] / r["floor_ms"], s["max"] / r["floor_ms"]
        met = "met" if hi <= 2 else "missed" if lo > 2 else "within the spread"
        rows.append(
            [
                f"{int(n) // K}K",
                f"{s['median']:.2f} [{s['min']:.2f}, {s['max']:.2f}]",
                r["wall_ms"]["split"]["median"],
                n_one,
                r["floor_ms"],
                f"{r['ratio']['split']:.2f}x [{lo:.2f}, {hi:.2f}]",
                met,
                r["bytes"]["total"] / 1e6,
                r["pure_mla_floor_ms"],
                r["full_mha_floor_ms"],
            ]
        )
    return markdown_table(header, rows)


# --------------------------------------------------------------------------------------------- prefill
def run_prefill(lengths: list[int], rounds: int, new_tokens: int, prefix_cache: bool) -> dict:
    model = tiny_model()
    tok = bench_tokenizer(512)
    acct = cache_accounting(model.cfg)
    samples: dict = {
        n: {
            "ttft_s": [],
            "ttft_cpu_s": [],
            "decode_ms": [],
            "peak_rise": [],
            "held_after": [],
            "held_trimmed": [],
        }
        for n in lengths
    }
    snaps: dict = {}
    for r in range(rounds):
        for n in lengths:
            cfg = EngineConfig(
                prefill_chunk=CHUNK,
                max_context=n + new_tokens + 1,
                prefix_cache=prefix_cache,
                cache_budget_bytes=max(1 << 30, 4 * (n + 64) * 1024),
            )
            engine = Engine(model, tok, cfg)
            ids = torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n + r)).tolist()
            release_freed_memory()
            before = rss_bytes()
            hwm_reset()
            t0, c0 = time.perf_counter(), time.process_time()
            h = engine.submit(ids, SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True))
            times = [
                (time.perf_counter() - t0, time.process_time() - c0) for ev in h.events() if ev.token_ids
            ]
            s = samples[n]
            s["ttft_s"].append(times[0][0])
            s["ttft_cpu_s"].append(times[0][1])
            times = [t for t, _ in times]
            s["decode_ms"].append((times[-1] - times[0]) / max(1, len(times) - 1) * 1e3)
            s["peak_rise"].append(peak_rss() - before)
            s["held_after"].append(rss_bytes() - before)
            if engine.prefix is not None:
                snaps[n] = engine.prefix.report()
            engine.close()
            del engine, h
            release_freed_memory()
            s["held_trimmed"].append(rss_bytes() - before)
            print("prefill", r, n, {k: round(v[-1], 3) for k, v in s.items()}, flush=True)
    b = model.embed.weight.element_size()
    rows = {}
    for n in lengths:
        predicted_bf16 = acct["kda_state_bytes_per_sequence"] + n * acct["mla_latent_bytes_per_token"]
        predicted_run = acct["kda_state_bytes_per_sequence"] + n * acct["mla_latent_bytes_per_token"] * b // 2
        s = samples[n]
        rows[n] = {k: counted_spread(v) for k, v in s.items()}
        rows[n]["prefill_tok_s"] = counted_spread([n / t for t in s["ttft_s"]])
        rows[n]["prefill_tok_per_cpu_s"] = counted_spread([n / t for t in s["ttft_cpu_s"]])
        rows[n]["predicted_cache_bytes_bf16"] = predicted_bf16
        rows[n]["predicted_cache_bytes_run_dtype"] = predicted_run
        if n in snaps:
            rows[n]["prefix"] = snaps[n]
    return {
        "rows": rows,
        "chunk": CHUNK,
        "new_tokens": new_tokens,
        "prefix_cache": prefix_cache,
        "threads": torch.get_num_threads(),
        "load_avg": load(),
        "model": "tiny preset, random weights, fp32",
    }


def prefill_table(res: dict) -> str:
    header = [
        "prompt tokens",
        "n",
        "TTFT s [min, max]",
        "prefill tok/s",
        "prefill tok per CPU-s",
        "decode ms/token after",
        "peak RSS rise MB",
        "held after (trimmed) MB",
        "prefix snapshots MB",
        "inspect cache MB (bf16 / fp32)",
        "run (threads)",
    ]
    rows = []
    for n, r in res["rows"].items():
        t = r["ttft_s"]
        label = "" if t["n"] > 1 else " (1 sample)"
        rows.append(
            [
                f"{int(n) // K}K{label}",
                t["n"],
                f"{t['median']:.1f} [{t['min']:.1f}, {t['max']:.1f}]",
                r["prefill_tok_s"]["median"],
                r["prefill_tok_per_cpu_s"]["median"],
                r["decode_ms"]["median"],
                r["peak_rise"]["median"] / 1e6,
                f"{r['held_after']['median'] / 1e6:.0f} ({r['held_trimmed']['median'] / 1e6:.0f})",
                f"{r['prefix']['prefix_snapshot_bytes'] / 1e6:.1f}" if "prefix" in r else "off",
                f"{r['predicted_cache_bytes_bf16'] / 1e6:.1f} / "
                f"{r['predicted_cache_bytes_run_dtype'] / 1e6:.1f}",
                f"{run_label(r, res)} ({(r.get('provenance') or res['provenance']).get('threads', '?')})",
            ]
        )
    return markdown_table(header, rows)


# -------------------------------------------------------------------------------------------------- op
@torch.no_grad()
def run_op(rows_n: int, rounds: int, iters: int = 3) -> dict:
    """One layer's decode attention (2 heads, 1 query, 32-wide rows) over ``rows_n`` cached rows,
    ``latent_attention`` with the prefix split (default) against one piece, alternating per round."""
    rows = torch.randn(1, rows_n + 1, 32)
    q = torch.randn(1, 2, 1, 32)
    out: dict = {"split": {"wall_ms": [], "cpu_ms": []}, "one piece": {"wall_ms": [], "cpu_ms": []}}
    for _ in range(rounds):
        for arm, splits in (("split", None), ("one piece", 1)):
            latent.latent_attention(q, rows, rows_n, splits=splits)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(iters):
                latent.latent_attention(q, rows, rows_n, splits=splits)
            out[arm]["wall_ms"].append((time.perf_counter() - t0) / iters * 1e3)
            out[arm]["cpu_ms"].append((time.process_time() - c0) / iters * 1e3)
            print("op", arm, out[arm]["wall_ms"][-1], out[arm]["cpu_ms"][-1], flush=True)
    return {"rows": rows_n, "threads": torch.get_num_threads(), "load_avg": load(),
            "arms": {a: {k: counted_spread(v) for k, v in d.items()} for a, d in out.items()}}  # fmt: skip


def op_table(res: dict) -> str:
    rows = [
        [a, f"{d['wall_ms']['median']:.0f} [{d['wall_ms']['min']:.0f}, {d['wall_ms']['max']:.0f}]",
         f"{d['cpu_ms']['median']:.0f} [{d['cpu_ms']['min']:.0f}, {d['cpu_ms']['max']:.0f}]"]
        for a, d in res["arms"].items()
    ]  # fmt: skip
    return markdown_table(["arm", "wall ms [min, max]", "CPU ms [min, max]"], rows)


# ------------------------------------------------------------------------------------------------ main
def plot(res: dict) -> None:
    from longmoe.report.plotting import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    dec = res.get("decode")
    if dec:
        xs = [int(n) for n in dec["rows"]]
        ax.plot(
            xs, [r["cpu_ms"]["split"]["median"] for r in dec["rows"].values()], "o-", label="decode, CPU ms"
        )
        ax.plot(xs, [r["floor_ms"] for r in dec["rows"].values()], "k--", label="floor (bytes / bandwidth)")
        ax.plot(xs, [2 * r["floor_ms"] for r in dec["rows"].values()], "k:", label="2x floor (target)")
        ax.plot(xs, [r["full_mha_floor_ms"] for r in dec["rows"].values()], ":", label="full-MHA floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("cached tokens")
    ax.set_ylabel("ms / token")
    ax.set_title(f"tiny preset, fp32, {dec['threads'] if dec else '?'} thread(s), shared machine")
    ax.legend()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=100, bbox_inches="tight")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "part",
        choices=("decode", "prefill", "http", "op", "tables"),
        help="what to measure (tables: rewrite the tables and plot from bench/results/long_context.json)",
    )
    p.add_argument("--lengths", default=None, help="comma-separated token counts")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    p.add_argument("--steps", type=int, default=16, help="decode steps timed per sample (16)")
    p.add_argument("--new-tokens", type=int, default=8, help="prefill: tokens generated after the prompt (8)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (2)")
    p.add_argument(
        "--prefix-cache",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="prefill: keep prefix snapshots (engine default on; off by default here)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    default = DECODE_LENGTHS if args.part == "decode" else PREFILL_LENGTHS
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else default
    path = RESULTS / "long_context.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    res = {k: old[k] for k in ("decode", "prefill", "prefill_prefix_cache", "http", "op") if k in old}
    t0 = time.process_time()
    if args.part == "decode":
        res["decode"] = run_decode(lengths, args.rounds, args.steps)
    elif args.part == "http":
        new = run_http(lengths, args.rounds, args.threads)
        if res.get("http", {}).get("server_malloc_tuned", False) == new["server_malloc_tuned"]:
            new["rows"] = merge_rows(
                res["http"], new["rows"], lengths, provenance()
            )  # a 1M request runs alone
        res["http"] = new
    elif args.part == "op":
        res["op"] = run_op(lengths[0] if args.lengths else 1024 * K, args.rounds)
    elif args.part == "tables":
        pass
    else:
        new = run_prefill(lengths, args.rounds, args.new_tokens, args.prefix_cache)
        key = "prefill_prefix_cache" if args.prefix_cache else "prefill"
        new["rows"] = merge_rows(res.get(key, {}), new["rows"], lengths, provenance())
        res[key] = new
    part = "prefill_prefix_cache" if args.part == "prefill" and args.prefix_cache else args.part
    if part != "tables":  # each part keeps the provenance of the run that measured it
        res[part]["cpu_seconds"] = time.process_time() - t0
        res[part]["provenance"] = provenance()
    tables = []
    if "decode" in res:
        tables.append(
            "Decode on a synthesised cache (random content: speed does not depend on it), CPU time per "
            "step (the machine is shared: wall time beside), floor = bytes / read bandwidth per CPU-second, "
            f"{res['decode']['threads']} threads under contention:\n\n" + decode_table(res["decode"])
        )
    if "prefill" in res:
        tables.append(
            "Prefill through `Engine` (prompt of random ids, prefill_chunk 4096), under contention; each "
            "row's run and thread count in its last column:\n\n" + prefill_table(res["prefill"])
        )
    if "prefill_prefix_cache" in res:
        tables.append(
            "The same with prefix snapshots on (the engine's default): what a long prompt leaves "
            "resident:\n\n" + prefill_table(res["prefill_prefix_cache"])
        )
    if "op" in res:
        o = res["op"]
        tables.append(
            f"One layer's decode attention over {o['rows'] // K}K cached rows (2 heads, 32-wide rows), "
            f"{o['threads']} threads under contention, {o['arms']['split']['wall_ms']['n']} alternating "
            "rounds: the prefix split into pieces the kernel runs in parallel, against one piece:\n\n"
            + op_table(o)
        )
    if "http" in res:
        tables.append(
            "Prefill through `longmoe serve` (HTTP, streamed; time to the first token as the client sees "
            f"it), {res['http']['threads']} threads under contention"
            + (
                "; the server kept freed memory for reuse in this run, so a request's RSS rise counts only "
                "growth past the earlier requests' peak: only the first request's is the true rise, "
                f"{max(r['peak_rise']['max'] for r in res['http']['rows'].values()) / 1e6:.0f} MB"
                if res["http"].get("server_malloc_tuned", True)
                else ""
            )
            + ":\n\n"
            + http_table(res["http"])
        )
    plot(res)
    write_results("long_context", res, "\n\n".join(tables))  # the plot: docs/benchmarks.md links it
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
