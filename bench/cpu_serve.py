"""CPU serving side by side: longmoe (eager, ``--compile``, int8) against llama.cpp (f32, q8_0).

One Kimi-Linear checkpoint (``bench/cpu_peer.py``: built in transformers' format, imported with
``longmoe convert --from-hf``, exported with ``--to-gguf``; ``--size 0.3b`` or ``15m``), all engines in one
process, for each ``--threads`` count. llama.cpp runs as its users run it: flash attention on and an f16 KV
cache (its CLI defaults) in the main rows; an f32 KV cache as a second row at the ``--second-rows``
contexts, and flash attention off (this harness's setting before 2026-12-07) as a "previous setting" row
at the first context and those; the setting is printed beside every peer row.

- **parity**: next-token logits of llama.cpp f32 and longmoe fp32 on the same 512 ids (max and median
  |Δlogit|, top-1 agreement), each also against transformers on the same checkpoint;
- batch-1 **decode** ms/token after a prompt of 1K / 4K / 16K / 32K tokens (longmoe: model + cache steps,
  eager and through the compiled steps; plus through the engine's scheduler at the first context),
  **prefill** tokens/s at 1K / 8K / 32K, weight bytes and resident memory (RSS delta);
- the **floor**: this machine's read bandwidth (sum over a 1 GiB tensor) and the weight bytes one decoded
  token reads (``bench/cpu_floor.py``): decode as a multiple of it; prefill as a share of the
  ``torch.mm`` roofline at the active FLOPs of the prompt;
- longmoe's batch-8/32 engine throughput beside llama.cpp's single stream (llama-cpp-python has one
  sequence).

Engines alternate per measurement (round-robin); medians and [min, max] over rounds are reported. A target
is "met" only when its ratio's range (worst round of one engine against the best of the other) lies wholly
on the target's side, "missed" when wholly on the other, else "not settled (ranges overlap)"; a context
with fewer than 3 rounds gets no verdict.

    python -m bench.cpu_serve                      # ~0.3B model, threads 1 and 2 (long: see docs)
    python -m bench.cpu_serve --size 15m           # the ~15M model (per-step overhead shows)
    python -m bench.cpu_serve --quick --threads 1  # d 256, 8 layers, contexts 512 / 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from functools import partial
from pathlib import Path

import torch

from bench import common, cpu_peer
from bench.common import RESULTS, gemm_roofline, markdown_table, verdict, write_results
from bench.cpu_floor import active_bytes, prefill_flops, read_bandwidth, rss_bytes, weight_bytes
from longmoe.checkpoint import load_model
from longmoe.report.provenance import load_average
from longmoe.runtime import release_freed_memory
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplingParams

PARITY_TOKENS, PARITY_TOL, TOP1_MIN = 512, 1e-2, 0.99
CHUNK = 2048  # prefill chunk (longmoe) and n_batch (llama.cpp)
# llama.cpp arms: name -> (GGUF outtype, flash attention, KV type, where measured: "all" contexts, or
# "second" (the --second-rows contexts), or "first+second")
LLAMA_ARMS = {
    "llama.cpp f32": ("f32", True, "f16", "all"),
    "llama.cpp q8_0": ("q8_0", True, "f16", "all"),
    "llama.cpp f32, KV f32": ("f32", True, "f32", "second"),
    "llama.cpp f32, FA off": ("f32", False, "f16", "first+second"),
    "llama.cpp q8_0, FA off": ("q8_0", False, "f16", "first+second"),
}
LONG_ARMS = {  # name -> (quantize, compile, where measured); the eager arms show the per-step cost at 1K
    "longmoe fp32": (None, False, "first"),
    "longmoe fp32 --compile": (None, True, "all"),
    "longmoe int8": ("int8", False, "first"),
    "longmoe int8 --compile": ("int8", True, "all"),
}
CLASS = {a: ("int8" if q else "fp32") for a, (q, _, _) in LONG_ARMS.items()}
CLASS.update({a: t for a, (t, _, _, _) in LLAMA_ARMS.items()})
PEER = {"fp32": "llama.cpp f32", "int8": "llama.cpp q8_0"}  # the strongest setting: the main rows
SETTING = {a: cpu_peer.setting(fa, kv) for a, (_, fa, kv, _) in LLAMA_ARMS.items()}
SETTING.update({a: "eager" if not c else "torch.compile steps" for a, (_, c, _) in LONG_ARMS.items()})


def where(arm: str) -> str:
    return (LLAMA_ARMS[arm][3]) if arm in LLAMA_ARMS else LONG_ARMS[arm][2]


def measured_at(arm: str, ctx: int, ctxs: list[int], second: list[int]) -> bool:
    """Whether ``arm`` is measured at context ``ctx`` of ``ctxs`` (its ``where`` rule)."""
    w = where(arm)
    return (
        w == "all"
        or (w == "first" and ctx == ctxs[0])
        or (w == "second" and ctx in second)
        or (w == "first+second" and (ctx == ctxs[0] or ctx in second))
    )


def ids_of(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class LongArm:
    """A longmoe engine; model + cache steps eager or through its compiled steps."""

    def __init__(self, model_dir: Path, tokenizer_dir: Path, quantize: str | None, compile: bool):
        model, tok, _ = load_model(model_dir)
        cfg = EngineConfig(prefill_chunk=CHUNK, prefix_cache=False, quantize=quantize, compile=compile,
                           quantize_head=quantize is not None,  # the head packed, as in q8_0
                           compile_warmup=False,  # compile on the first decode, not behind our timing
                           cache_budget_bytes=8 << 30, max_context=1 << 17)  # fmt: skip
        self.engine = Engine(model.float(), tok, cfg)
        self.model = self.engine.model
        # eager: the head on the last position only, as the engine and llama.cpp run a prefill
        self.fn = self.engine.compiled or (lambda x, c: self.model(x, cache=c, logits_to_keep=1).logits)

    @torch.inference_mode()  # as the engine's loop runs its steps
    def prefill(self, ids: list[int]):
        cache = self.model.new_cache(1)
        x = torch.tensor([ids])
        for i in range(0, len(ids), CHUNK):
            self.fn(x[:, i : i + CHUNK], cache)
        return cache

    @torch.inference_mode()
    def decode(self, state, n: int) -> float:
        c, x = state.clone(), torch.tensor([[7]])
        self.fn(x, c)  # untimed: grows the latent buffer once
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.fn(x, c)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    def close(self) -> None:
        self.engine.close()


class LlamaArm:
    """llama.cpp: the state lives in the context, so each decode round appends ``n + 1`` tokens."""

    def __init__(self, path: Path, n_ctx: int, threads: int, flash_attn: bool, kv: str):
        self.peer = cpu_peer.LlamaPeer(path, n_ctx, threads, n_batch=CHUNK, flash_attn=flash_attn, kv=kv)

    def prefill(self, ids: list[int]):
        self.peer.prefill(ids)

    def decode(self, state, n: int) -> float:
        self.peer.step(7)
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.peer.step(7)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3

    def close(self) -> None:
        self.peer.close()


def parity(paths: dict, have_llama: bool) -> dict:
    """llama.cpp f32 vs longmoe fp32 vs transformers, next-token logits on the same ids."""
    ids = ids_of(PARITY_TOKENS, 11)
    model, _, _ = load_model(paths["longmoe"])
    with torch.inference_mode():
        ours = model.float().eval()(torch.tensor([ids])).logits[0].float()
    del model
    ref = cpu_peer.hf_logits(paths["hf"], ids)
    out: dict = {"tokens": len(ids), "tolerance_abs": PARITY_TOL, "top1_min": TOP1_MIN}
    try:
        if not have_llama:
            raise ImportError("llama_cpp not importable (make bench-cpu installs llama-cpp-python)")
        # the exact setting (no flash attention, f32 KV): parity checks the conversion, not the kernels
        peer = cpu_peer.LlamaPeer(paths["f32"], PARITY_TOKENS + 8, torch.get_num_threads(), logits_all=True,
                                  flash_attn=False, kv="f32")  # fmt: skip
        theirs = peer.logits(ids)
        peer.close()
    except Exception as e:  # the file does not load: say why, keep the longmoe rows
        out["llama_cpp_error"] = f"{type(e).__name__}: {e}"
        theirs = None

    def cmp(a: torch.Tensor, b: torch.Tensor) -> dict:
        d = (a - b).abs()
        ok = float(d.max()) <= PARITY_TOL
        top1 = float((a.argmax(-1) == b.argmax(-1)).float().mean())
        return {"max_abs": float(d.max()), "median_abs": float(d.median()), "top1": top1,
                "within_tolerance": ok and top1 >= TOP1_MIN}  # fmt: skip

    out["longmoe_vs_transformers"] = cmp(ours, ref)
    if theirs is not None:
        out["llama_cpp_vs_longmoe"] = cmp(theirs, ours)
        out["llama_cpp_vs_transformers"] = cmp(theirs, ref)
        bad = [
            k
            for k in ("longmoe_vs_transformers", "llama_cpp_vs_transformers")
            if not out[k]["within_tolerance"]
        ]
        out["differs_from_reference"] = [k.split("_vs_")[0] for k in bad]
    out["logit_std"] = float(ref.std())
    print("parity", out, flush=True)
    return out


def make_arms(paths: dict, n_ctx: int, threads: int, have_llama: bool) -> tuple[dict, dict]:
    """Every engine, with its RSS delta (construction and a 16-token warm-up) and compile seconds."""
    arms, info = {}, {}
    for name, (q, comp, _) in LONG_ARMS.items():
        release_freed_memory()  # else the parity models' freed pages are reused and the delta reads ~0
        r0, t0 = rss_bytes(), time.perf_counter()
        arm = LongArm(paths["longmoe"], paths["longmoe"], q, comp)
        for n in (16, CHUNK + 16):  # compiles: full and partial prefill chunks, two decode capacities
            arm.decode(arm.prefill(ids_of(n, 0)), 1)
        info[name] = {"rss_delta": rss_bytes() - r0, "warmup_s": time.perf_counter() - t0}
        arms[name] = arm
    if have_llama:
        for name, (t, fa, kv, _) in LLAMA_ARMS.items():
            release_freed_memory()
            r0, t0 = rss_bytes(), time.perf_counter()
            arm = LlamaArm(paths[t], n_ctx, threads, fa, kv)
            arm.prefill(ids_of(16, 0))
            arm.decode(None, 1)
            info[name] = {"rss_delta": rss_bytes() - r0, "warmup_s": time.perf_counter() - t0,
                          "file_bytes": paths[t].stat().st_size}  # fmt: skip
            arms[name] = arm
    return arms, info


def measure(
    arms: dict, dec_ctxs: list[int], pre_ctxs: list[int], n: int, rounds: int, second: list[int]
) -> dict:
    """Round-robin samples: ``{"decode": {ctx: {arm: [ms]}}, "prefill": {ctx: {arm: [s]}}}``, each arm
    at the contexts its ``where`` rule names; every prefill context gets ``rounds`` rounds."""
    dec: dict = {c: {a: [] for a in arms if measured_at(a, c, dec_ctxs, second)} for c in dec_ctxs}
    pre: dict = {c: {a: [] for a in arms if measured_at(a, c, pre_ctxs, second)} for c in pre_ctxs}
    for ctx in dec_ctxs:
        ids, states = ids_of(ctx, ctx), {}
        for a in dec[ctx]:
            arm = arms[a]
            t0 = time.perf_counter()
            states[a] = arm.prefill(ids)
            if ctx in pre and a in pre[ctx]:
                pre[ctx][a].append(time.perf_counter() - t0)
        for _ in range(rounds):
            for a in dec[ctx]:
                dec[ctx][a].append(arms[a].decode(states[a], n))
        print("decode", ctx, {a: round(statistics.median(v), 2) for a, v in dec[ctx].items()}, flush=True)
        del states
    for ctx in pre_ctxs:
        ids = ids_of(ctx, ctx + 1)
        while min(len(v) for v in pre[ctx].values()) < rounds:
            for a in pre[ctx]:
                if len(pre[ctx][a]) >= rounds:
                    continue
                t0 = time.perf_counter()
                arms[a].prefill(ids)
                pre[ctx][a].append(time.perf_counter() - t0)
        print("prefill", ctx, {a: round(ctx / min(v)) for a, v in pre[ctx].items()}, flush=True)
    return {"decode": dec, "prefill": pre}


def engine_rows(arms: dict, ctx: int, n: int, batches: list[int], new_tokens: int) -> dict:
    """Decode through each longmoe engine's scheduler at ``ctx`` and batch-B throughput (tok/s)."""
    out: dict = {}
    one = SamplingParams(max_tokens=n + 2, temperature=0.0, ignore_eos=True)
    for a, arm in arms.items():
        if not isinstance(arm, LongArm) or not batches:
            continue
        h = arm.engine.submit(ids_of(ctx, 3), one)
        stamps = [time.perf_counter() for _ in h.events()]
        gaps = [y - x for x, y in zip(stamps[1:], stamps[2:], strict=False)]
        p = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        tput = {}
        for b in batches:
            arm.engine.generate_batch([ids_of(128, 90 + i) for i in range(b)], p)  # compiles batch b
            t0 = time.perf_counter()
            arm.engine.generate_batch([ids_of(128, 100 + i) for i in range(b)], p)
            tput[b] = b * new_tokens / (time.perf_counter() - t0)
        out[a] = {"engine_decode_ms": statistics.median(gaps) * 1e3, "batch_tok_s": tput}
    return out


def profile(arms: dict, ctx: int, threads: int) -> str:
    """torch.profiler's top ops: one decode step of the eager fp32 engine and of each compiled one (the
    steps the decode targets are held against; inductor's graph is one ``Torch-Compiled Region`` row),
    and one prefill chunk of the eager engine."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    steps = [("longmoe fp32", "decode step"), ("longmoe fp32 --compile", "decode step"),
             ("longmoe int8 --compile", "decode step"), ("longmoe fp32", "prefill chunk")]  # fmt: skip
    md = []
    for name, what in steps:
        arm = arms.get(name)
        if arm is None:
            continue
        try:
            if what == "decode step":
                state = arm.prefill(ids_of(ctx, 5))
                arm.decode(state, 1)  # untimed: a first call may still build something
                run = partial(arm.decode, state, 1)
            else:
                run = partial(arm.prefill, ids_of(CHUNK, 6))
            with prof(activities=[ProfilerActivity.CPU]) as p:
                run()
            top = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        except Exception as e:  # a profile must not cost the run its measurements
            top = f"profile failed: {type(e).__name__}: {e}"
        md.append(f"## {name}: {what} (context {ctx}, {threads} thread(s))\n\n```\n{top}\n```")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"# bench.cpu_serve --profile ({threads} thread(s), {stamp})\n\n" + "\n\n".join(md) + "\n"


def ratio_range(ours: list[float], peer: list[float]) -> dict:
    """ours / peer: the median ratio and its range, worst round of one against the best of the other."""
    return {"median": statistics.median(ours) / statistics.median(peer), "min": min(ours) / max(peer),
            "max": max(ours) / min(peer), "n": min(len(ours), len(peer))}  # fmt: skip


def targets(res: dict, floors: dict, dec_ctxs: list[int], pre_ctxs: list[int]) -> list[dict]:
    """The issue's targets against llama.cpp's main rows (flash attention on, KV f16), each with its ratio's
    range and a verdict (``verdict``): decode <= 1.0x at the first context, ahead from 16K, prefill >= 1.5x
    tok/s from 8K. Ratios are within one thread count's run."""
    dec, pre, out = res["decode"], res["prefill"], []

    def add(name: str, r: dict, good) -> None:
        out.append({"target": name, "value": r["median"], "range": [r["min"], r["max"]], "n": r["n"],
                    "verdict": verdict(r["min"], r["max"], r["n"], good)})  # fmt: skip
        out[-1]["met"] = out[-1]["verdict"] == "met"

    for cls, peer in PEER.items():
        ours = f"longmoe {cls} --compile"
        if peer not in dec[dec_ctxs[0]]:
            continue
        c0 = dec_ctxs[0]
        add(
            f"decode {ours} <= 1.0x {peer} @ {c0}",
            ratio_range(dec[c0][ours], dec[c0][peer]),
            lambda r: r <= 1,
        )
        for c in (c for c in dec_ctxs if c >= 16384):
            add(
                f"decode {ours} ahead of {peer} @ {c}",
                ratio_range(dec[c][ours], dec[c][peer]),
                lambda r: r < 1,
            )
        for c in (c for c in pre_ctxs if c >= 8192):
            # tok/s ratio = peer seconds / our seconds
            r = ratio_range(pre[c][peer], pre[c][ours])
            add(f"prefill {ours} >= 1.5x {peer} tok/s @ {c}", r, lambda r: r >= 1.5)
    for cls in PEER:
        ours = f"longmoe {cls} --compile"
        xs = dec[dec_ctxs[0]][ours]
        r = {"median": statistics.median(xs) / floors[cls], "min": min(xs) / floors[cls],
             "max": max(xs) / floors[cls], "n": len(xs)}  # fmt: skip
        add(f"decode {ours} within 2x the {cls} floor @ {dec_ctxs[0]}", r, lambda r: r <= 2.0)
    return out


def table(runs: dict, paths_cfg, dec_ctxs, pre_ctxs, parity_res: dict, size: str) -> str:
    rows: list[list[object]] = []
    for threads, run in runs.items():
        res, floors = run["measured"], run["floor_ms"]
        for ctx in dec_ctxs:
            for a, xs in res["decode"][ctx].items():
                m = statistics.median(xs)
                rows.append(
                    [
                        threads,
                        f"decode ms/token @ {ctx}",
                        a,
                        SETTING[a],
                        m,
                        f"[{min(xs):.3g}, {max(xs):.3g}] n={len(xs)}",
                        f"{m / floors[CLASS[a]]:.2f}x floor",
                    ]
                )
        for ctx in pre_ctxs:
            for a, xs in res["prefill"][ctx].items():
                tps = ctx / statistics.median(xs)
                share = prefill_flops(paths_cfg, ctx) / statistics.median(xs) / run["roofline_flops"]
                rows.append(
                    [
                        threads,
                        f"prefill tok/s @ {ctx}",
                        a,
                        SETTING[a],
                        tps,
                        f"[{ctx / max(xs):.3g}, {ctx / min(xs):.3g}] n={len(xs)}",
                        f"{share:.0%} of mm roofline",
                    ]
                )
        for a, e in run["engine"].items():
            rows.append(
                [
                    threads,
                    f"engine decode ms/token @ {dec_ctxs[0]}",
                    a,
                    SETTING[a],
                    e["engine_decode_ms"],
                    "",
                    "",
                ]
            )
            for b, tps in e["batch_tok_s"].items():
                rows.append(
                    [threads, f"engine tok/s, batch {b}", a, SETTING[a], tps, "", "llama.cpp: one stream"]
                )
        for a, inf in run["memory"].items():
            rows.append(
                [threads, "RSS delta MB (load + warm-up)", a, SETTING[a], inf["rss_delta"] / 2**20, "", ""]
            )
        for t in run["targets"]:
            lo, hi = t["range"]
            rows.append(
                [
                    threads,
                    "target: " + t["target"],
                    "",
                    "" if "floor" in t["target"] else "peer: " + SETTING[PEER["fp32"]],
                    t["value"],
                    f"[{lo:.3g}, {hi:.3g}] n={t['n']}",
                    t["verdict"],
                ]
            )
    header = [
        "threads",
        "measurement",
        "engine",
        "setting",
        "value",
        "[min, max] over rounds",
        "vs floor / verdict",
    ]
    p = parity_res
    lines = [markdown_table(header, rows), ""]
    if "llama_cpp_vs_longmoe" in p:
        q = p["llama_cpp_vs_longmoe"]
        lines.append(
            f"Parity (llama.cpp f32, flash attention off, KV f32, vs longmoe fp32, {p['tokens']} ids): "
            f"max |Δlogit| {q['max_abs']:.2e}, "
            f"median {q['median_abs']:.2e}, top-1 {q['top1']:.3f} (tolerance {PARITY_TOL:g} abs, "
            f"top-1 >= {TOP1_MIN}; logit std {p['logit_std']:.3g}); off the transformers "
            f"reference: {', '.join(p['differs_from_reference']) or 'neither'}."
        )
    else:
        lines.append(f"llama.cpp rows missing: {p.get('llama_cpp_error', 'llama_cpp not importable')}.")
    q = p["longmoe_vs_transformers"]
    lines.append(f"longmoe fp32 vs transformers: max |Δlogit| {q['max_abs']:.2e}, top-1 {q['top1']:.3f}.")
    for t, r in runs.items():
        when = r.get("measured_at")
        if when:
            la = r.get("load_average") or {}
            load = f"; load average {la.get('start')} at start, {la.get('end')} at end" if la else ""
            lines.append(
                f"{t} thread(s): measured {when}, {r.get('cpu_s', 0):,.0f} CPU s{load}"
                + (f"; {r['note']}" if r.get("note") else "")
                + "."
            )
    bw = ", ".join(f"{t} thr {r['bandwidth_gb_s']:.1f} GB/s" for t, r in runs.items())
    lines.append(
        f"\nModel: {cpu_peer.LABEL[size]} Kimi-Linear ({paths_cfg.d_model} wide, "
        f"{paths_cfg.n_layers} layers), "
        f"random weights. CPU, shared machine; read bandwidth {bw}. Floor = active weight bytes per "
        "token / bandwidth (KV and state reads not included). Eager arms are measured at the first "
        "context only; peer settings as stated per row."
    )
    return "\n".join(lines)


def stored_runs(
    name: str, cfg, contexts: dict[str, list[int]], threads: list[int], results: Path = RESULTS
) -> dict:
    """``--merge``: the runs of other thread counts in the stored results, when they measured the same
    model at the same contexts (``contexts`` as this run writes it: decode, prefill, second rows; JSON keys
    are strings, contexts come back as ints)."""
    path = results / f"{name}.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    if old.get("config") != cfg.to_dict() or old.get("contexts") != contexts:
        raise SystemExit(
            f"--merge: {path.name} measured another model or other contexts "
            f"({old.get('contexts')} there, {contexts} here)"
        )
    out = {}
    for t, run in old["runs"].items():
        if int(t) not in threads:
            run.setdefault("commit", (old.get("provenance") or {}).get("commit"))  # written before per-run
            for kind in ("decode", "prefill"):
                run["measured"][kind] = {int(c): v for c, v in run["measured"][kind].items()}
            out[int(t)] = run
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--size",
        choices=[k for k in cpu_peer.SIZES if k != "quick"],
        default="0.3b",
        help="the checkpoint: 0.3b (default) or 15m (d 256, 4 heads of 64, 16 experts top-4)",
    )
    ap.add_argument("--quick", action="store_true", help="d 256, 8 layers, contexts 512 / 2048")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--contexts", default=None, help="decode contexts (default 1024,4096,16384,32768)")
    ap.add_argument("--prefill", default=None, help="prefill lengths (default 1024,8192,32768)")
    ap.add_argument(
        "--second-rows",
        default="16384",
        help="contexts of llama.cpp's KV-f32 and flash-attention-off rows (default 16384)",
    )
    ap.add_argument("--rounds", type=int, default=None, help="round-robin rounds (default 5; quick 2)")
    ap.add_argument(
        "--batches",
        default=None,
        help="engine batch sizes for throughput rows, '' for none (default 8,32; quick 8)",
    )
    ap.add_argument("--workdir", type=Path, default=Path("runs/cpu_serve"), help="cached model and GGUFs")
    ap.add_argument("--profile", action="store_true", help="write bench/results/cpu_serve_profile.md")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument("--note", default="", help="the machine's conditions during this run (kept per run)")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep the stored runs of other thread counts (same model and contexts) beside this run's",
    )
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    size = "quick" if args.quick else args.size
    threads = [int(t) for t in args.threads.split(",")]
    dec_ctxs = [
        int(c) for c in (args.contexts or ("512,2048" if args.quick else "1024,4096,16384,32768")).split(",")
    ]
    pre_ctxs = [
        int(c) for c in (args.prefill or ("512,2048" if args.quick else "1024,8192,32768")).split(",")
    ]
    second = [int(c) for c in args.second_rows.split(",") if c.strip()]
    rounds = args.rounds or (2 if args.quick else 5)
    n_dec = 4 if args.quick else 16
    b_arg = args.batches if args.batches is not None else ("8" if args.quick else "8,32")
    batches, new_tokens = [int(b) for b in b_arg.split(",") if b.strip()], (8 if args.quick else 32)
    workdir = args.workdir / {"quick": "quick", "0.3b": "full", "15m": "15m"}[size]
    name = {"quick": "cpu_serve_quick", "0.3b": "cpu_serve", "15m": "cpu_serve_15m"}[size]
    paths = cpu_peer.build(workdir, size)
    from longmoe.config import ModelConfig

    cfg = ModelConfig.load(paths["longmoe"] / "config.json")
    try:
        import llama_cpp  # noqa: F401

        have_llama = True
    except ImportError:
        have_llama = False
    torch.set_num_threads(threads[0])
    with torch.inference_mode():
        par = parity(paths, have_llama)
    have_llama = have_llama and "llama_cpp_error" not in par
    n_ctx = max(dec_ctxs + pre_ctxs) + rounds * (n_dec + 1) * len(dec_ctxs) + 64
    contexts = {"decode": dec_ctxs, "prefill": pre_ctxs, "second_rows": second}
    runs: dict = stored_runs(name, cfg, contexts, threads) if args.merge else {}
    arms: dict = {}
    compile_s: dict = {}
    with torch.inference_mode():
        for t in threads:
            torch.set_num_threads(t)
            if not arms:
                arms, mem = make_arms(paths, n_ctx, t, have_llama)
            for arm in arms.values():
                if isinstance(arm, LlamaArm):
                    arm.peer.set_threads(t)
            load0, cpu0 = load_average(), time.process_time()
            bw, roof = read_bandwidth(), gemm_roofline()
            floors = {c: active_bytes(cfg, c)["total"] / bw * 1e3 for c in ("fp32", "int8", "f32", "q8_0")}
            res = measure(arms, dec_ctxs, pre_ctxs, n_dec, rounds, second)
            eng = engine_rows(arms, dec_ctxs[0], n_dec, batches, new_tokens)
            goals = targets(res, floors, dec_ctxs, pre_ctxs)
            runs[t] = {"bandwidth_gb_s": bw / 1e9, "roofline_flops": roof, "floor_ms": floors,
                       "measured": res, "engine": eng, "memory": mem, "targets": goals,
                       "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "commit": common.START_COMMIT,  # a --merge file holds runs of several commits
                       "cpu_s": time.process_time() - cpu0,
                       "load_average": {"start": load0, "end": load_average()},
                       "note": args.note}  # fmt: skip
            compile_s = {a: arm.engine.compiled.compile_seconds for a, arm in arms.items()
                         if isinstance(arm, LongArm) and arm.engine.compiled is not None}  # fmt: skip
            # written after each thread count: a run cut short keeps what it measured
            write(name, runs, cfg, dec_ctxs, pre_ctxs, second, par, size, compile_s, args)
        if args.profile:
            (RESULTS / "cpu_serve_profile.md").write_text(profile(arms, dec_ctxs[0], t))
    for arm in arms.values():
        arm.close()
    return 0


def write(name, runs, cfg, dec_ctxs, pre_ctxs, second, par, size, compile_s, args) -> None:
    md = table(dict(sorted(runs.items())), cfg, dec_ctxs, pre_ctxs, par, size)
    md += "\n\nCompile seconds (all shapes): " + ", ".join(f"{a} {s:.0f}" for a, s in compile_s.items()) + "."
    payload = {
        "model": {"size": size, "label": cpu_peer.LABEL[size], "kimi_shapes": cpu_peer.kimi_shapes(size)},
        "config": cfg.to_dict(),
        "weights": {p: weight_bytes(cfg, p) for p in ("fp32", "int8", "q8_0")},
        "active_bytes_per_token": {p: active_bytes(cfg, p) for p in ("fp32", "int8", "q8_0")},
        "parity": par,
        "peer_settings": {a: SETTING[a] for a in LLAMA_ARMS},
        "llama_cpp_build": cpu_peer.llama_build(),
        "runs": {str(t): r for t, r in sorted(runs.items())},
        "contexts": {"decode": dec_ctxs, "prefill": pre_ctxs, "second_rows": second},
        "compile_s": compile_s,
        "quick": args.quick,
    }
    write_results(name, payload, md, update_readme=not (args.quick or args.no_readme))


if __name__ == "__main__":
    raise SystemExit(main())
