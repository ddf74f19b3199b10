"""Serving benchmark: decode cost vs context, chunked-prefill speed, batched throughput.

Models (random weights, fp32, CPU): the ``tiny`` preset's shapes (hidden 128, 8 layers, 2 heads x 32,
MLA q-rank 64 / kv-rank 32, 8 experts top-2 of width 64 + 1 shared, first layer dense 256, vocab
2048; ``latent_ratio=1`` so the experts match the peer's) as

- the **hybrid** ``LLLM`` (6 KDA + 2 MLA layers), served by the engine;
- a **pure-MLA** pattern ``M`` (8 MLA layers), same shapes, served by the engine;
- ``transformers``' ``KimiLinearForCausalLM`` with the same shapes (KDA layers 1-3, 5-7, MLA 4, 8),
  timed inside its own ``generate`` (a logits processor stamps every generated token).

Measured in the same run: decode ms/token after a prompt of 1K, 4K, 16K, 32K tokens (ours: model +
cache steps; the peer: gaps between tokens in ``generate``; ``bench/serve_decode.py``);
engine decode ms/token at batch 1, eager and with ``--compile`` (torch.compile; compile time too);
prefill tokens/s of an 8K prompt by engine chunk size; generated tokens/s with 1, 8 and 32
concurrent requests (continuous batching); prefix reuse (time to first token after a 4K-token shared
prefix) and speculative decoding (tokens/s and acceptance rate by ``k``), each against the same engine
without it (``bench/serve_fast.py``); sampled decode with a JSON-schema grammar vs without
(``bench/structured.py``). Engines run without prefix reuse unless a row says otherwise.

Every headline number (decode cost growth by context, prefix-reuse time to first token, throughput 32 /
1, chat turn-10 / turn-1) is measured in ``--rounds`` alternating rounds (the arms back to back inside
each round): the JSON keeps each value's median over rounds under the key one sample had, the per-round
values beside it, and each ratio's per-round median and [min, max] (``*_range``, ``*_speedup``).

    python -m bench.serve            # full sizes, 3 rounds (several minutes on 2 shared cores)
    python -m bench.serve --quick    # contexts 512/2048, small prompts, one round (about a minute)
    python -m bench.serve --only prefix   # hits by offset and chat turns (serve_prefix.json), 3 rounds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch

from bench.common import (
    add_rounds_option,
    bench_tokenizer,
    markdown_table,
    range_cell,
    rounds_arg,
    spread,
    write_results,
)
from bench.serve_decode import WINDOWS, decode_rounds, engine_decode, peer_model, rand_ids
from bench.serve_fast import prefix_rows, prefix_turn_rows
from bench.structured import structured_rows
from longmoe.config import ModelConfig
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.compiled import CACHE_ENV
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplingParams

MAX_CTX = 1 << 16


def hybrid_config(pattern: str = "LLLM") -> ModelConfig:
    cfg = preset("tiny")
    ffn = cfg.ffn.__class__(**{**cfg.ffn.__dict__, "latent_ratio": 1})
    return cfg.replace(layer_pattern=pattern, max_seq_len=MAX_CTX, ffn=ffn)


def make_engine(cfg: ModelConfig, **kw) -> Engine:
    """An engine on a random model of ``cfg`` (seed 0)."""
    torch.manual_seed(0)
    opts = {"cache_budget_bytes": 8 << 30, "prefill_chunk": 2048, "prefix_cache": False, **kw}
    return Engine(LongMoE(cfg), bench_tokenizer(512), EngineConfig(**opts))


def compiled_decode(
    eager: Engine,
    cfg: ModelConfig,
    ctx: int,
    n: int,
    rows: list,
    rounds: int = 5,
) -> dict:
    """``--compile``: an engine with torch.compile'd steps against the eager ``eager`` engine, batch 1,
    the same prompt. The first compiled request compiles (the B=1 decode graph) and is timed apart;
    then ``rounds`` rounds alternate one eager and one compiled request, so a burst of other work on
    this shared machine hits both arms alike. The speed-up is the **median of the per-round ratios**
    (the best round of each arm, taken from different rounds, overstates it), with their range."""
    with make_engine(cfg, compile=True, compile_warmup=False) as comp:
        t0 = time.perf_counter()
        engine_decode(comp, ctx, n)
        first_s = time.perf_counter() - t0
        assert comp.compiled is not None
        compile_s = comp.compiled.compile_seconds
        pairs = [(engine_decode(eager, ctx, n)[0], engine_decode(comp, ctx, n)[0]) for _ in range(rounds)]
        recompiled_s = comp.compiled.compile_seconds - compile_s
    per_round = [e / c for e, c in pairs]
    eager_ms = statistics.median(p[0] for p in pairs)
    comp_ms = statistics.median(p[1] for p in pairs)
    speedup = statistics.median(per_round)
    rows.append([f"engine decode ms/token batch 1 @ ctx {ctx}, eager (median of rounds)", eager_ms, "", ""])
    rows.append([f"engine decode ms/token batch 1 @ ctx {ctx}, compiled (--compile)", comp_ms, "", ""])
    rows.append(
        [
            f"compiled decode speed-up, median of {rounds} per-round ratios [range] (target >= 3)",
            speedup,
            f"{min(per_round):.2f}–{max(per_round):.2f}",
            "",
        ]
    )
    rows.append(["compile time s (first request: the B=1 decode graph)", compile_s, "", ""])
    print(rows[-4:], flush=True)
    return {
        "context": ctx,
        "eager_ms": eager_ms,
        "compiled_ms": comp_ms,
        "speedup": speedup,
        "speedup_min": min(per_round),
        "speedup_max": max(per_round),
        "rounds": [{"eager_ms": e, "compiled_ms": c} for e, c in pairs],
        "compile_s": compile_s,
        "compile_s_after_first_request": recompiled_s,
        "first_request_s": first_s,
    }


def compile_config(name: str) -> ModelConfig:
    """``--compile-model``: ``tiny`` (the hybrid above); ``100m``: the ``small`` preset cut to 4 layers
    (3 KDA + 1 MLA) and 32 experts, 111M parameters; ``kimi300m``: the ~0.3B Kimi-Linear-shaped model
    of the CPU side-by-side with llama.cpp (``bench/cpu_peer.py``), as ``convert --from-hf`` imports it."""
    if name == "tiny":
        return hybrid_config()
    if name == "kimi300m":  # the config convert --from-hf writes for cpu_peer's transformers config
        from bench.cpu_peer import kimi_shapes
        from longmoe.interop.kimi_config import config_from_hf

        return config_from_hf(kimi_shapes("0.3b"), dtype="float32").replace(max_seq_len=MAX_CTX)
    cfg = preset("small")
    ffn = cfg.ffn.__class__(**{**cfg.ffn.__dict__, "n_experts": 32})
    return cfg.replace(n_layers=4, ffn=ffn, max_seq_len=MAX_CTX)


def first_token_child(ctx: int, model: str) -> int:
    """In a fresh process (``--first-token-child``): start a ``--compile`` engine without the background
    warm-up and time its first request up to the first decoded token (the B=1 decode graph compiles
    there; prefill is eager). Prints one JSON line."""
    t0 = time.perf_counter()
    with torch.inference_mode(), make_engine(compile_config(model), compile=True, compile_warmup=False) as e:
        params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
        t1 = time.perf_counter()
        stamps = [time.perf_counter() for _ in e.submit(rand_ids(ctx, e.vocab_size, ctx), params).events()]
        assert e.compiled is not None
        out = {
            "engine_start_s": t1 - t0,
            "first_token_s": stamps[0] - t1,  # prefill (eager)
            "first_decoded_token_s": stamps[-1] - t1,  # + the first decode step, which compiles
            "compile_s": e.compiled.compile_seconds,
        }
    print(json.dumps(out), flush=True)
    return 0


def first_token_times(ctx: int, rounds: int, threads: int, model: str) -> dict:
    """Cold (empty inductor cache dir) and warm (the same dir again) first-token times, each in a fresh
    process, alternating cold and warm ``rounds`` times so the machine's load hits both alike. The last
    round's cache dir becomes this process's (the decode rounds after it start warm)."""
    runs: dict = {"cold": [], "warm": []}
    for _ in range(rounds):
        d = tempfile.mkdtemp(prefix="longmoe-inductor-")
        env = {**os.environ, CACHE_ENV: d}
        for kind in ("cold", "warm"):
            cmd = [sys.executable, "-m", "bench.serve", "--first-token-child", "--threads", str(threads)]
            cmd += ["--compile-model", model]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[kind].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(kind, runs[kind][-1], flush=True)
        if runs.get("cache_dir"):
            shutil.rmtree(runs["cache_dir"], ignore_errors=True)  # an earlier round's (ours)
        runs["cache_dir"] = d
    if rounds:
        os.environ[CACHE_ENV] = runs["cache_dir"]  # before this process's first compile
    return runs


def compile_only(model: str, ctx: int, n: int, first_token_rounds: int = 1) -> int:
    cfg, rows = compile_config(model), []
    threads = torch.get_num_threads()
    ft = first_token_times(ctx, first_token_rounds, threads, model) if first_token_rounds else {}
    for kind in ("cold", "warm") if ft else ():
        runs = ft[kind]
        ts = [r["first_decoded_token_s"] for r in runs]
        rows.append([f"first decoded token s, {kind} cache (fresh process; min / max)", min(ts), max(ts), ""])
        rows.append([f"  of which compile s, {kind}", min(r["compile_s"] for r in runs), "", ""])
    with torch.inference_mode(), make_engine(cfg) as eager:
        engine_decode(eager, ctx, n)  # warm-up
        res = compiled_decode(eager, cfg, ctx, n, rows)
        n_params = eager.model.num_parameters() / 1e6
    res["first_token"] = ft
    table = markdown_table(["measurement", "hybrid LLLM" if model == "tiny" else model, "", ""], rows)
    shapes = "tiny-preset shapes" if model == "tiny" else f"{model} model ({n_params:.0f}M parameters)"
    table += f"\n\nCPU, fp32, {threads} thread(s), shared machine; {shapes}, random weights."
    name = "serve_compile" if model == "tiny" else f"serve_compile_{model}"
    write_results(name, {"config": cfg.to_dict(), "compiled": res}, table, update_readme=False)
    if ft:
        shutil.rmtree(ft.pop("cache_dir"), ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    ap.add_argument("--no-peer", action="store_true", help="skip the transformers model")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README table")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    ap.add_argument(
        "--compile-only", action="store_true", help="only the eager vs --compile batch-1 decode rows"
    )
    ap.add_argument("--only", choices=["prefix"], help="only these rows (prefix: hits by offset, chat turns)")
    ap.add_argument(
        "--first-token-rounds",
        type=int,
        default=1,
        help="--compile-only: cold/warm first-token process pairs (0: skip; each cold one compiles)",
    )
    ap.add_argument(
        "--compile-model", choices=("tiny", "100m", "kimi300m"), default="tiny", help="--compile-only model"
    )
    ap.add_argument("--first-token-child", action="store_true", help=argparse.SUPPRESS)
    add_rounds_option(ap)
    args = ap.parse_args()
    rounds = rounds_arg(ap, args)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    ctxs = [512, 2048] if args.quick else [1024, 4096, 16384, 32768]
    n_dec = 8 if args.quick else 16
    prefill_T = 2048 if args.quick else 8192
    chunks = [128, 512, 2048] if args.quick else [128, 512, 2048, 8192]
    conc, conc_tokens = [1, 8, 32], 16 if args.quick else 64
    cfg = hybrid_config()
    if args.first_token_child:
        return first_token_child(ctxs[0], args.compile_model)
    if args.compile_only:
        return compile_only(args.compile_model, ctxs[0], n_dec, args.first_token_rounds)
    if args.only == "prefix":
        with torch.inference_mode():
            rows, res = prefix_turn_rows(
                lambda **kw: make_engine(cfg, **kw), rand_ids, cfg.vocab_size, args.quick, rounds
            )
        table = markdown_table(["measurement", "hybrid LLLM", "", ""], rows)
        table += (
            f"\n\nCPU, fp32, {torch.get_num_threads()} thread(s), shared machine; tiny-preset shapes, random "
            "weights (hits and times do not depend on the predictions). Hits: a prompt sharing its first "
            "`p` tokens with a stored 200-token prompt, then differing. Turns: each adds the new tokens and "
            "the previous reply; time to first token through the engine; times are medians [min, max] over "
            f"{rounds} alternating rounds (each round: a fresh engine per arm, the arms' order alternating)."
        )
        name = "serve_prefix_quick" if args.quick else "serve_prefix"
        write_results(
            name, {"config": cfg.to_dict(), "n_rounds": rounds, **res}, table, update_readme=not args.quick
        )
        return 0
    return full_run(cfg, args, rounds, ctxs, n_dec, prefill_T, chunks, conc, conc_tokens)


def full_run(cfg, args, rounds: int, ctxs, n_dec: int, prefill_T: int, chunks, conc, conc_tokens: int) -> int:
    """Every row but the ``--compile-only`` ones; headline numbers over ``rounds`` alternating rounds."""
    results: dict = {"prefill": [], "n_rounds": rounds}
    rows = []

    with torch.inference_mode():
        hybrid, mla = make_engine(cfg), make_engine(hybrid_config("M"))
        peer = None if args.no_peer else peer_model(cfg, MAX_CTX)
        results |= decode_rounds(hybrid, mla, peer, ctxs, n_dec, rounds)
        for r in results["decode"]:
            cells = [
                range_cell(spread([x[k] for x in r["rounds"]]), ".3g")
                for k in ("hybrid_ms", "pure_mla_ms", "peer_ms")
            ]
            rows.append([f"decode ms/token @ ctx {r['context']}", *cells])
        eng_ms, _ = engine_decode(hybrid, ctxs[0], n_dec)
        results["engine_decode_ms_first_ctx"] = eng_ms
        rng = results["decode_ratio_range"]
        rows.append(
            [
                f"decode ratio ctx {ctxs[-1]} / {ctxs[0]}, per-round (target hybrid <= 1.3)",
                *(range_cell(rng[k]) for k in ("hybrid", "pure_mla", "peer")),
            ]
        )
        rows.append(
            [f"engine decode ms/token @ ctx {ctxs[0]} (scheduler included; one sample)", eng_ms, "", ""]
        )
        mla.close()

        results["compiled"] = compiled_decode(hybrid, cfg, ctxs[0], n_dec, rows)

        prompt = rand_ids(prefill_T, cfg.vocab_size, 1)
        one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        for cs in chunks:
            with make_engine(cfg, prefill_chunk=cs) as e:
                e.generate(prompt[:256], one)  # warm-up
                t0 = time.perf_counter()
                e.generate(prompt, one)
                tps = prefill_T / (time.perf_counter() - t0)
            results["prefill"].append({"chunk_size": cs, "prompt": prefill_T, "tok_s": tps})
            rows.append([f"prefill tok/s, {prefill_T}-token prompt, chunk {cs} (one sample)", tps, "", ""])
            print(rows[-1], flush=True)

        results |= throughput_rounds(hybrid, cfg.vocab_size, conc, conc_tokens, rounds)
        for t in results["throughput"]:
            rows.append(
                [f"throughput tok/s, {t['concurrent']} concurrent x {conc_tokens} tokens",
                 range_cell(spread(t["rounds"]), ".4g"), "", ""]
            )  # fmt: skip
        results["structured"], more = structured_rows(
            hybrid, rand_ids(32, cfg.vocab_size, 7), 2 * n_dec, rounds
        )
        rows += more
        print(*more, sep="\n", flush=True)
        hybrid.close()

        def engine(**kw) -> Engine:
            return make_engine(cfg, **kw)

        for key, fn in (
            ("prefix_reuse", prefix_rows),
            ("prefix_turns", prefix_turn_rows),
        ):
            new_rows, results[key] = fn(engine, rand_ids, cfg.vocab_size, args.quick, rounds)
            rows += new_rows
            print(new_rows, flush=True)
    rows.append(
        [
            "throughput ratio 32 / 1, per-round (target >= 8)",
            range_cell(results["throughput_ratio_range"]),
            "",
            "",
        ]
    )

    header = ["measurement", "hybrid LLLM", "pure MLA", "transformers KimiLinear generate"]
    table = markdown_table(header, rows)
    table += (
        f"\n\nCPU, fp32, {torch.get_num_threads()} thread(s), shared machine; tiny-preset shapes, random "
        f"weights. Values: median [min, max] over {rounds} alternating rounds (a ratio: of its per-round "
        f"values); rows marked one sample are measured once. Decode: ours = model + cache step after a "
        f"chunked prefill, median of {n_dec} steps, best of {WINDOWS} windows; transformers = median gap "
        f"between tokens inside generate, best of {WINDOWS} windows; each round runs every context on the "
        "three arms back to back. Prefill and throughput go through the engine."
    )
    name = "serve_quick" if args.quick else "serve"
    write_results(
        name, {"config": cfg.to_dict(), **results}, table, update_readme=not (args.no_readme or args.quick)
    )
    return 0


def throughput_rounds(engine: Engine, vocab: int, conc: list[int], n_tokens: int, rounds: int) -> dict:
    """Generated tok/s with each number of concurrent requests, every count once per round; the
    ratio of the largest count to one request per round (median, [min, max])."""
    p = SamplingParams(max_tokens=n_tokens, temperature=0.0, ignore_eos=True)
    engine.generate(rand_ids(32, vocab, 0), p)  # warm-up
    per: dict[int, list[float]] = {n: [] for n in conc}
    for _ in range(rounds):
        for n in conc:
            ps = [rand_ids(32, vocab, 100 + i) for i in range(n)]
            t0 = time.perf_counter()
            engine.generate_batch(ps, p)
            per[n].append(n * n_tokens / (time.perf_counter() - t0))
            print(f"throughput {n} concurrent: {per[n][-1]:.1f} tok/s", flush=True)
    rng = spread([a / b for a, b in zip(per[conc[-1]], per[conc[0]], strict=True)])
    return {
        "throughput": [{"concurrent": n, "tok_s": statistics.median(v), "rounds": v} for n, v in per.items()],
        "throughput_ratio_32_vs_1": rng["median"],  # conc is [1, 8, 32]
        "throughput_ratio_range": rng,
    }


if __name__ == "__main__":
    raise SystemExit(main())
