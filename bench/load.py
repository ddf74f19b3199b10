"""Bounded load test: N concurrent streaming clients against a loopback server, no cross-talk.

Starts the OpenAI-compatible server on 127.0.0.1 (random port) over a model (``--model DIR``, or a
random-init tiny model with the test tokenizer), computes every prompt's greedy output alone with
the engine, then runs all clients at once through ``/v1/completions`` with ``stream: true`` and
checks: every request succeeded, every stream ended with ``data: [DONE]``, and every streamed text
equals its solo output. Exits non-zero otherwise; a global timeout makes it stop by itself.

    python -m bench.load                 # 32 clients x 32 tokens
    python -m bench.load --clients 8 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import torch

from bench.common import markdown_table, write_results
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.server import create_app, serve_in_thread

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
    from longmoe.config import preset
    from longmoe.data.tokenizer import tokenizer_for_tests
    from longmoe.model import LongMoE

    torch.manual_seed(seed)
    model = LongMoE(preset("tiny").replace(vocab_size=512, tie_embeddings=False, **cfg_kw))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return Engine(model, tokenizer_for_tests(512))


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
    import httpx

    limits = httpx.Limits(max_connections=len(ps) + 4)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        tasks = [one_client(client, url, p, max_tokens) for p in ps]
        res = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), timeout_s)
    return [r if isinstance(r, dict) else {"error": f"{type(r).__name__}: {r}"} for r in res]


def run(clients: int = 32, max_tokens: int = 32, model: str | None = None, timeout_s: float = 300) -> dict:
    engine = Engine.from_dir(model) if model else random_engine()
    ps = prompts(clients)
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    t0 = time.perf_counter()
    solo = [engine.generate(p, greedy).text for p in ps]
    solo_s = time.perf_counter() - t0
    server, thread, port = serve_in_thread(create_app(engine, model_name="longmoe"))
    try:
        t0 = time.perf_counter()
        res = asyncio.run(run_clients(f"http://127.0.0.1:{port}", ps, max_tokens, timeout_s))
        wall = time.perf_counter() - t0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        stats = engine.stats()
        engine.close()
    errors = [r["error"] for r in res if "error" in r]
    mismatches = [i for i, (r, s) in enumerate(zip(res, solo, strict=True)) if "text" in r and r["text"] != s]
    ok = [r for r in res if "text" in r]
    return {
        "clients": clients,
        "max_tokens": max_tokens,
        "errors": errors,
        "mismatches": mismatches,
        "wall_s": wall,
        "solo_sequential_s": solo_s,
        "speedup_vs_sequential": solo_s / wall,
        "mean_ttft_s": sum(r["ttft_s"] for r in ok) / max(1, len(ok)),
        "max_total_s": max((r["total_s"] for r in ok), default=float("nan")),
        "cache_bytes_after": stats["cache_bytes_in_use"],
        "running_after": stats["running"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32, help="concurrent streaming clients (32)")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per request (32)")
    ap.add_argument("--model", default=None, help="model directory (default: random-init tiny model)")
    ap.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (300)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    r = run(args.clients, args.max_tokens, args.model, args.timeout)
    rows = [
        ["clients", r["clients"]],
        ["tokens per request", r["max_tokens"]],
        ["errors", len(r["errors"])],
        ["outputs != solo greedy", len(r["mismatches"])],
        ["wall s (concurrent)", r["wall_s"]],
        ["wall s (same requests one by one)", r["solo_sequential_s"]],
        ["speedup", r["speedup_vs_sequential"]],
        ["mean time to first token s", r["mean_ttft_s"]],
    ]
    table = markdown_table(["load test (loopback, streaming)", "value"], rows)
    write_results("load", r, table, update_readme=False)
    for e in r["errors"][:5]:
        print("error:", e)
    return 1 if r["errors"] or r["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
