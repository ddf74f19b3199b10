"""Bounded load test: N concurrent streaming clients against a loopback server, no cross-talk.

Starts the OpenAI-compatible server on 127.0.0.1 (random port) over a model (``--model DIR``, or a
random-init tiny model with the test tokenizer), computes every prompt's greedy output alone with
the engine, then runs all clients at once through ``/v1/completions`` with ``stream: true`` and
checks: every request succeeded, every stream ended with ``data: [DONE]``, and every streamed text
equals its solo output. Exits non-zero otherwise; a global timeout makes it stop by itself.

Then (``--stop-streams``, on by default) it checks that one request with the most stop strings the
API allows (``MAX_STOP_STRINGS`` of ``MAX_STOP_CHARS`` characters, never matching) does not slow the
other streams: in each round, ``K`` streams run alongside one extra *plain* request, then alongside
one extra *maximal-stop* request (same length); the table gives the other streams' ms/token for
both (median over rounds) and their ratio. An extra row of either kind costs the same batch row, so
the ratio isolates the stop-string work.

The concurrent run and the same requests one by one alternate in ``--rounds`` rounds (3), as do the
stop-string arms: the JSON keeps medians under the keys one round wrote, every round's values under
``rounds`` and the per-round speed-up's median and [min, max] under ``speedup_range``.

    python -m bench.load                  # 32 clients x 32 tokens, 3 rounds, then the stop-string rounds
    python -m bench.load --clients 8 --max-tokens 8 --stop-tokens 64 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import httpx
import torch

from bench.common import bench_tokenizer, markdown_table, range_cell, spread, write_results
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.api import create_app, serve_in_thread
from longmoe.serve.api.protocol import MAX_STOP_CHARS, MAX_STOP_STRINGS
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "that",
    "def",
    "class",
    "return",
    "import",
    "self",
]


def random_engine(seed: int = 0, **cfg_kw) -> Engine:
    """Tiny preset (vocab 512, untied embeddings, weights moved off init) + the test tokenizer."""
    torch.manual_seed(seed)
    model = LongMoE(preset("tiny").replace(vocab_size=512, tie_embeddings=False, **cfg_kw))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return Engine(model, bench_tokenizer(512))


def prompts(n: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        k = 3 + int(torch.randint(0, 40, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (k,), generator=g).tolist()
        out.append(f"{i}: " + " ".join(WORDS[j] for j in idx))
    return out


async def one_client(client, url: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": "longmoe", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    text, done, t0, first = [], False, time.perf_counter(), None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"error": f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"}
        async for line in r.aiter_lines():
            if not line:
                continue
            if not line.startswith("data: "):
                return {"error": f"not an SSE data line: {line[:80]!r}"}
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            first = first or time.perf_counter()
            text.append(json.loads(data)["choices"][0]["text"])
    if not done:
        return {"error": "stream ended without data: [DONE]"}
    return {"text": "".join(text), "ttft_s": (first or t0) - t0, "total_s": time.perf_counter() - t0}


async def run_clients(url: str, ps: list[str], max_tokens: int, timeout_s: float) -> list[dict]:
    limits = httpx.Limits(max_connections=len(ps) + 4)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        tasks = [one_client(client, url, p, max_tokens) for p in ps]
        res = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout_s)
    return [r if isinstance(r, dict) else {"error": f"{type(r).__name__}: {r}"} for r in res]


def run(
    clients: int = 32, max_tokens: int = 32, model: str | None = None, timeout_s: float = 300, rounds: int = 1
) -> dict:
    """``rounds`` alternating rounds of the same prompts one at a time (the engine alone) and all at once
    (streaming clients through the server), their order reversed in odd rounds. Each round's streamed
    texts are checked against its solo outputs. ``wall_s`` / ``solo_sequential_s`` are medians over rounds,
    ``speedup_vs_sequential`` the per-round ratio's median (``speedup_range``: its [min, max])."""
    engine = Engine.from_dir(model) if model else random_engine()
    ps = prompts(clients)
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    app = create_app(engine, model_name="longmoe", max_requests_per_client=0)  # one address plays N clients
    server, thread, port = serve_in_thread(app)
    per: list[dict] = []
    errors: list[str] = []
    mismatches: set[int] = set()
    ok: list[dict] = []
    try:
        engine.generate(ps[0], greedy)  # warm-up: round 0's first arm starts warm like the others
        for r in range(rounds):
            got: dict = {}
            for arm in ("solo", "concurrent") if r % 2 == 0 else ("concurrent", "solo"):
                t0 = time.perf_counter()
                if arm == "solo":
                    solo = [engine.generate(p, greedy).text for p in ps]
                    got["solo_sequential_s"] = time.perf_counter() - t0
                else:
                    res = asyncio.run(run_clients(f"http://127.0.0.1:{port}", ps, max_tokens, timeout_s))
                    got["wall_s"] = time.perf_counter() - t0
            errors += [x["error"] for x in res if "error" in x]
            mismatches |= {
                i for i, (x, s) in enumerate(zip(res, solo, strict=True)) if "text" in x and x["text"] != s
            }
            ok += [x for x in res if "text" in x]
            per.append(got)
            print(f"load round {r}:", got, flush=True)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        stats = engine.stats()
        engine.close()
    speedup = spread([g["solo_sequential_s"] / g["wall_s"] for g in per])
    return {
        "clients": clients,
        "max_tokens": max_tokens,
        "n_rounds": rounds,
        "errors": errors,
        "mismatches": sorted(mismatches),
        "wall_s": statistics.median(g["wall_s"] for g in per),
        "solo_sequential_s": statistics.median(g["solo_sequential_s"] for g in per),
        "speedup_vs_sequential": speedup["median"],
        "speedup_range": speedup,
        "rounds": per,
        "mean_ttft_s": sum(x["ttft_s"] for x in ok) / max(1, len(ok)),
        "max_total_s": max((x["total_s"] for x in ok), default=float("nan")),
        "cache_bytes_after": stats["cache_bytes_in_use"],
        "running_after": stats["running"],
    }


MAX_STOPS = [f"{i}" + "\u00a7" * (MAX_STOP_CHARS - 1) for i in range(MAX_STOP_STRINGS)]  # never generated


async def timed_stream(client: httpx.AsyncClient, url: str, body: dict) -> float:
    """Stream one completion; its ms per token after the first (from the usage count)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    first = tokens = None
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first = first or time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    assert first is not None and tokens is not None and tokens > 1
    return (time.perf_counter() - first) * 1000 / (tokens - 1)


async def stop_round(
    url: str, ps: list[str], n_tokens: int, extra_stop: list[str], timeout_s: float
) -> list[float]:
    """The ms/token of ``ps``'s streams while one extra request with ``extra_stop`` runs beside them."""
    body = {"model": "longmoe", "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(
        timeout=timeout_s, limits=httpx.Limits(max_connections=len(ps) + 4)
    ) as client:
        extra = timed_stream(client, url, {**body, "prompt": "extra request", "stop": extra_stop})
        streams = [timed_stream(client, url, {**body, "prompt": p}) for p in ps]
        res = await asyncio.wait_for(asyncio.gather(extra, *streams), timeout_s)
    return res[1:]


def run_stops(
    streams: int = 4, n_tokens: int = 128, rounds: int = 3, model: str | None = None, timeout_s: float = 300
) -> dict:
    """Other streams' ms/token beside a plain extra request vs beside a maximal-stop one, alternating
    which goes first in each round; medians over rounds and streams."""
    engine = Engine.from_dir(model) if model else random_engine()
    app = create_app(engine, model_name="longmoe", max_requests_per_client=0)
    server, thread, port = serve_in_thread(app)
    url, ps = f"http://127.0.0.1:{port}", prompts(streams, seed=1)
    plain: list[float] = []
    stops: list[float] = []
    try:
        asyncio.run(stop_round(url, ps, 8, [], timeout_s))  # warm-up
        for r in range(rounds):
            order = [([], plain), (MAX_STOPS, stops)]
            for extra, out in order if r % 2 == 0 else order[::-1]:
                out.extend(asyncio.run(stop_round(url, ps, n_tokens, extra, timeout_s)))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        engine.close()
    p, s = statistics.median(plain), statistics.median(stops)
    per_round = [
        statistics.median(stops[i : i + streams]) / statistics.median(plain[i : i + streams])
        for i in range(0, len(plain), streams)
    ]
    return {
        "streams": streams,
        "tokens_per_stream": n_tokens,
        "rounds": rounds,
        "stop_strings": f"{MAX_STOP_STRINGS} x {MAX_STOP_CHARS} chars",
        "ms_per_token_beside_plain": p,
        "ms_per_token_beside_max_stops": s,
        "ratio": s / p,
        "round_ratios": per_round,
        "all_plain": plain,
        "all_stops": stops,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32, help="concurrent streaming clients (32)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request (32)")
    ap.add_argument("--model", default=None, help="model directory (default: random-init tiny model)")
    ap.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (300)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    ap.add_argument(
        "--stop-streams", type=int, default=4, help="streams measured beside the stop request (4; 0: skip)"
    )
    ap.add_argument("--stop-tokens", type=int, default=256, help="tokens per stream in the stop rounds (256)")
    ap.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="alternating rounds: concurrent + one by one, plain + maximal-stop (3)",
    )
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    torch.set_num_threads(args.threads)
    r = run(args.clients, args.max_tokens, args.model, args.timeout, args.rounds)
    rows = [
        ["clients", r["clients"]],
        ["tokens per request", r["max_tokens"]],
        ["errors (all rounds)", len(r["errors"])],
        ["outputs != solo greedy (all rounds)", len(r["mismatches"])],
        ["wall s (concurrent)", range_cell(spread([g["wall_s"] for g in r["rounds"]]), ".3g")],
        [
            "wall s (same requests one by one)",
            range_cell(spread([g["solo_sequential_s"] for g in r["rounds"]]), ".3g"),
        ],
        ["speedup, per-round", range_cell(r["speedup_range"])],
        ["mean time to first token s", r["mean_ttft_s"]],
    ]
    if args.stop_streams:
        st = run_stops(args.stop_streams, args.stop_tokens, args.rounds, args.model, args.timeout)
        r["stops"] = st
        n = f"{st['streams']} streams x {st['tokens_per_stream']} tokens"
        rows += [
            [f"ms/token of {n}, beside a plain request", st["ms_per_token_beside_plain"]],
            [
                f"ms/token of {n}, beside one with {st['stop_strings']} stop strings",
                st["ms_per_token_beside_max_stops"],
            ],
            ["ratio (maximal stops / plain), of the medians", st["ratio"]],
            ["the same ratio per round, median [min, max]", range_cell(spread(st["round_ratios"]))],
        ]
    table = markdown_table(["load test (loopback, streaming)", "value"], rows)
    table += (
        f"\n\nValues with a range: median [min, max] over {r['n_rounds']} alternating rounds (a speed-up:"
        f" of its per-round ratio). CPU, {torch.get_num_threads()} thread(s), shared machine."
    )
    write_results("load", r, table, update_readme=False)
    for e in r["errors"][:5]:
        print("error:", e)
    return 1 if r["errors"] or r["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
