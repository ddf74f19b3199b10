"""CPU serving side by side: longmoe (eager, ``--compile``, int8) against llama.cpp (f32, q8_0).

One Kimi-Linear checkpoint (``bench/cpu_peer.py``: built in transformers' format, imported with
``longmoe convert --from-hf``, exported with ``--to-gguf``), all engines in one process, for each
``--threads`` count:

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

Engines alternate per measurement (round-robin); medians and [min, max] over rounds are reported.

    python -m bench.cpu_serve                      # ~0.3B model, threads 1 and 2 (long: see docs)
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

from bench import cpu_peer
from bench.common import RESULTS, gemm_roofline, markdown_table, write_results
from bench.cpu_floor import active_bytes, prefill_flops, read_bandwidth, rss_bytes, weight_bytes
from longmoe.checkpoint import load_model
from longmoe.runtime import release_freed_memory
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplingParams

PARITY_TOKENS, PARITY_TOL, TOP1_MIN = 512, 1e-2, 0.99
CHUNK = 2048  # prefill chunk (longmoe) and n_batch (llama.cpp)
CLASS = {"longmoe fp32": "fp32", "longmoe fp32 --compile": "fp32", "longmoe int8": "int8",
         "longmoe int8 --compile": "int8", "llama.cpp f32": "f32", "llama.cpp q8_0": "q8_0"}  # fmt: skip
PEER = {"fp32": "llama.cpp f32", "int8": "llama.cpp q8_0"}


def ids_of(n: int, seed: int, vocab: int = 512) -> list[int]:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


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

    def __init__(self, path: Path, n_ctx: int, threads: int):
        self.peer = cpu_peer.LlamaPeer(path, n_ctx, threads, n_batch=CHUNK)

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
        peer = cpu_peer.LlamaPeer(paths["f32"], PARITY_TOKENS + 8, torch.get_num_threads(), logits_all=True)
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
    specs = [("longmoe fp32", None, False), ("longmoe fp32 --compile", None, True),
             ("longmoe int8", "int8", False), ("longmoe int8 --compile", "int8", True)]  # fmt: skip
    for name, q, comp in specs:
        release_freed_memory()  # else the parity models' freed pages are reused and the delta reads ~0
        r0, t0 = rss_bytes(), time.perf_counter()
        arm = LongArm(paths["longmoe"], paths["longmoe"], q, comp)
        for n in (16, CHUNK + 16):  # compiles: full and partial prefill chunks, two decode capacities
            arm.decode(arm.prefill(ids_of(n, 0)), 1)
        info[name] = {"rss_delta": rss_bytes() - r0, "warmup_s": time.perf_counter() - t0}
        arms[name] = arm
    if have_llama:
        for t in cpu_peer.OUTTYPES:
            name = f"llama.cpp {t}"
            release_freed_memory()
            r0, t0 = rss_bytes(), time.perf_counter()
            arm = LlamaArm(paths[t], n_ctx, threads)
            arm.prefill(ids_of(16, 0))
            arm.decode(None, 1)
            info[name] = {"rss_delta": rss_bytes() - r0, "warmup_s": time.perf_counter() - t0,
                          "file_bytes": paths[t].stat().st_size}  # fmt: skip
            arms[name] = arm
    return arms, info


def measure(arms: dict, dec_ctxs: list[int], pre_ctxs: list[int], n: int, rounds: int) -> dict:
    """Round-robin samples: ``{"decode": {ctx: {arm: [ms]}}, "prefill": {ctx: {arm: [s]}}}``."""
    dec: dict = {c: {a: [] for a in arms} for c in dec_ctxs}
    pre: dict = {c: {a: [] for a in arms} for c in pre_ctxs}
    for ctx in dec_ctxs:
        ids, states = ids_of(ctx, ctx), {}
        for a, arm in arms.items():
            t0 = time.perf_counter()
            states[a] = arm.prefill(ids)
            if ctx in pre:
                pre[ctx][a].append(time.perf_counter() - t0)
        for _ in range(rounds):
            for a, arm in arms.items():
                dec[ctx][a].append(arm.decode(states[a], n))
        print("decode", ctx, {a: round(statistics.median(v), 2) for a, v in dec[ctx].items()}, flush=True)
        del states
    for ctx in pre_ctxs:
        extra = (rounds if ctx <= 8192 else 1) - len(next(iter(pre[ctx].values())))
        ids = ids_of(ctx, ctx + 1)
        for _ in range(max(extra, 0)):
            for a, arm in arms.items():
                t0 = time.perf_counter()
                arm.prefill(ids)
                pre[ctx][a].append(time.perf_counter() - t0)
        print("prefill", ctx, {a: round(ctx / min(v)) for a, v in pre[ctx].items()}, flush=True)
    return {"decode": dec, "prefill": pre}


def engine_rows(arms: dict, ctx: int, n: int, batches: list[int], new_tokens: int) -> dict:
    """Decode through each longmoe engine's scheduler at ``ctx`` and batch-B throughput (tok/s)."""
    out: dict = {}
    one = SamplingParams(max_tokens=n + 2, temperature=0.0, ignore_eos=True)
    for a, arm in arms.items():
        if not isinstance(arm, LongArm):
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


def targets(res: dict, floors: dict, dec_ctxs: list[int], pre_ctxs: list[int]) -> list[dict]:
    """The issue's targets, each met / missed (ratios within one thread count's run)."""
    med = lambda xs: statistics.median(xs)  # noqa: E731
    dec, pre, out = res["decode"], res["prefill"], []
    for cls, peer in PEER.items():
        ours = f"longmoe {cls} --compile"
        if peer not in dec[dec_ctxs[0]]:
            continue
        r = med(dec[dec_ctxs[0]][ours]) / med(dec[dec_ctxs[0]][peer])
        out.append({"target": f"decode {ours} <= 1.0x {peer} @ {dec_ctxs[0]}", "value": r, "met": r <= 1.0})
        for c in dec_ctxs[2:]:
            r = med(dec[c][ours]) / med(dec[c][peer])
            out.append({"target": f"decode {ours} ahead of {peer} @ {c}", "value": r, "met": r < 1.0})
        for c in pre_ctxs[1:]:
            r = min(pre[c][peer]) / min(pre[c][ours])
            out.append({"target": f"prefill {ours} >= 1.5x {peer} tok/s @ {c}", "value": r, "met": r >= 1.5})
    for cls in PEER:
        ours = f"longmoe {cls} --compile"
        r = med(dec[dec_ctxs[0]][ours]) / floors[cls]
        out.append({"target": f"decode {ours} within 2x the {cls} floor @ {dec_ctxs[0]}", "value": r,
                    "met": r <= 2.0})  # fmt: skip
    return out


def table(runs: dict, paths_cfg, dec_ctxs, pre_ctxs, parity_res: dict, quick: bool) -> str:
    rows: list[list[object]] = []
    for threads, run in runs.items():
        res, floors = run["measured"], run["floor_ms"]
        for ctx in dec_ctxs:
            for a, xs in res["decode"][ctx].items():
                m = statistics.median(xs)
                rows.append([threads, f"decode ms/token @ {ctx}", a, m, f"[{min(xs):.3g}, {max(xs):.3g}]",
                             f"{m / floors[CLASS[a]]:.2f}x floor"])  # fmt: skip
        for ctx in pre_ctxs:
            for a, xs in res["prefill"][ctx].items():
                tps, share = ctx / min(xs), prefill_flops(paths_cfg, ctx) / min(xs) / run["roofline_flops"]
                rows.append(
                    [threads, f"prefill tok/s @ {ctx}", a, tps, f"n={len(xs)}", f"{share:.0%} of mm roofline"]
                )
        for a, e in run["engine"].items():
            rows.append(
                [threads, f"engine decode ms/token @ {dec_ctxs[0]}", a, e["engine_decode_ms"], "", ""]
            )
            for b, tps in e["batch_tok_s"].items():
                rows.append([threads, f"engine tok/s, batch {b}", a, tps, "", "llama.cpp: one stream"])
        for a, inf in run["memory"].items():
            rows.append([threads, "RSS delta MB (load + warm-up)", a, inf["rss_delta"] / 2**20, "", ""])
        for t in run["targets"]:
            rows.append(
                [threads, "target: " + t["target"], "", t["value"], "met" if t["met"] else "missed", ""]
            )
    header = ["threads", "measurement", "engine", "value", "spread / n", "vs floor / roofline"]
    p = parity_res
    lines = [markdown_table(header, rows), ""]
    if "llama_cpp_vs_longmoe" in p:
        q = p["llama_cpp_vs_longmoe"]
        lines.append(f"Parity (llama.cpp f32 vs longmoe fp32, {p['tokens']} ids): "
                     f"max |Δlogit| {q['max_abs']:.2e}, "
                     f"median {q['median_abs']:.2e}, top-1 {q['top1']:.3f} (tolerance {PARITY_TOL:g} abs, "
                     f"top-1 >= {TOP1_MIN}; logit std {p['logit_std']:.3g}); off the transformers "
                     f"reference: {', '.join(p['differs_from_reference']) or 'neither'}.")  # fmt: skip
    else:
        lines.append(f"llama.cpp rows missing: {p.get('llama_cpp_error', 'llama_cpp not importable')}.")
    q = p["longmoe_vs_transformers"]
    lines.append(f"longmoe fp32 vs transformers: max |Δlogit| {q['max_abs']:.2e}, top-1 {q['top1']:.3f}.")
    for t, r in runs.items():
        when = r.get("measured_at")
        if when:
            lines.append(
                f"{t} thread(s): measured {when}" + (f"; {r['note']}" if r.get("note") else "") + "."
            )
    bw = ", ".join(f"{t} thr {r['bandwidth_gb_s']:.1f} GB/s" for t, r in runs.items())
    lines.append(f"\nCPU, shared machine; read bandwidth {bw}; random weights"
                 f"{' (--quick: d 256, 8 layers)' if quick else ''}. Floor = active weight bytes per token / "
                 "bandwidth (KV and state reads not included).")  # fmt: skip
    return "\n".join(lines)


def stored_runs(cfg, dec_ctxs: list[int], pre_ctxs: list[int], threads: list[int]) -> dict:
    """``--merge``: the runs of other thread counts in the stored results, when they measured the same
    model at the same contexts (JSON keys are strings; contexts come back as ints)."""
    path = RESULTS / "cpu_serve.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    same = old.get("config") == cfg.to_dict() and old.get("contexts") == {
        "decode": dec_ctxs,
        "prefill": pre_ctxs,
    }
    if not same:
        raise SystemExit("--merge: the stored cpu_serve.json measured another model or other contexts")
    out = {}
    for t, run in old["runs"].items():
        if int(t) not in threads:
            for kind in ("decode", "prefill"):
                run["measured"][kind] = {int(c): v for c, v in run["measured"][kind].items()}
            out[int(t)] = run
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="d 256, 8 layers, contexts 512 / 2048")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--contexts", default=None, help="decode contexts (default 1024,4096,16384,32768)")
    ap.add_argument("--prefill", default=None, help="prefill lengths (default 1024,8192,32768)")
    ap.add_argument("--rounds", type=int, default=None, help="round-robin rounds (default 5; quick 2)")
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
    threads = [int(t) for t in args.threads.split(",")]
    dec_ctxs = [
        int(c) for c in (args.contexts or ("512,2048" if args.quick else "1024,4096,16384,32768")).split(",")
    ]
    pre_ctxs = [
        int(c) for c in (args.prefill or ("512,2048" if args.quick else "1024,8192,32768")).split(",")
    ]
    rounds = args.rounds or (2 if args.quick else 5)
    n_dec = 4 if args.quick else 16
    batches, new_tokens = ([8] if args.quick else [8, 32]), (8 if args.quick else 32)
    workdir = args.workdir / ("quick" if args.quick else "full")
    paths = cpu_peer.build(workdir, args.quick)
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
    runs: dict = stored_runs(cfg, dec_ctxs, pre_ctxs, threads) if args.merge else {}
    arms: dict = {}
    with torch.inference_mode():
        for t in threads:
            torch.set_num_threads(t)
            if not arms:
                arms, mem = make_arms(paths, n_ctx, t, have_llama)
            for arm in arms.values():
                if isinstance(arm, LlamaArm):
                    arm.peer.set_threads(t)
            bw, roof = read_bandwidth(), gemm_roofline()
            floors = {c: active_bytes(cfg, c)["total"] / bw * 1e3 for c in ("fp32", "int8", "f32", "q8_0")}
            res = measure(arms, dec_ctxs, pre_ctxs, n_dec, rounds)
            eng = engine_rows(arms, dec_ctxs[0], n_dec, batches, new_tokens)
            goals = targets(res, floors, dec_ctxs, pre_ctxs)
            runs[t] = {"bandwidth_gb_s": bw / 1e9, "roofline_flops": roof, "floor_ms": floors,
                       "measured": res, "engine": eng, "memory": mem, "targets": goals,
                       "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "note": args.note}  # fmt: skip
        compile_s = {a: arm.engine.compiled.compile_seconds for a, arm in arms.items()
                     if isinstance(arm, LongArm) and arm.engine.compiled is not None}  # fmt: skip
        if args.profile:
            (RESULTS / "cpu_serve_profile.md").write_text(profile(arms, dec_ctxs[0], t))
    for arm in arms.values():
        arm.close()
    md = table(dict(sorted(runs.items())), cfg, dec_ctxs, pre_ctxs, par, args.quick)
    md += "\n\nCompile seconds (all shapes): " + ", ".join(f"{a} {s:.0f}" for a, s in compile_s.items()) + "."
    payload = {
        "config": cfg.to_dict(),
        "weights": {p: weight_bytes(cfg, p) for p in ("fp32", "int8", "q8_0")},
        "active_bytes_per_token": {p: active_bytes(cfg, p) for p in ("fp32", "int8", "q8_0")},
        "parity": par,
        "runs": {str(t): r for t, r in sorted(runs.items())},
        "contexts": {"decode": dec_ctxs, "prefill": pre_ctxs},
        "compile_s": compile_s,
        "quick": args.quick,
    }
    name = "cpu_serve_quick" if args.quick else "cpu_serve"
    write_results(name, payload, md, update_readme=not (args.quick or args.no_readme))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
