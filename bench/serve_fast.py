"""Rows of ``bench/serve.py`` for prefix reuse, each against the same engine without it (same model,
same run).

- **prefix reuse**: time to first token of a request whose prompt is a 4K-token shared prefix (a
  system prompt, a long document) plus a 64-token tail, after one earlier request with that prefix;
  and the wall time of an RL-style group (``G`` samples of one 4K-token task submitted together);
- **hits by offset and chat turns** (``prefix_turn_rows``): the prefix hit length against the true
  shared length, and time to first token per turn of a multi-turn chat, with and without reuse.

Speculative decoding is measured by ``bench/spec.py`` on a trained target: on this benchmark's random
weights the target's argmax mostly repeats its input, so every draft looks good.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams

Row = list
MakeEngine = Callable[..., Engine]


def ttft(engine: Engine, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    h = engine.submit(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    first = None
    for _ in h.events():
        first = first or time.perf_counter()
    return (first or time.perf_counter()) - t0


def prefix_rows(
    make_engine: MakeEngine, rand_ids: Callable, vocab: int, quick: bool
) -> tuple[list[Row], dict]:
    shared, tail, reps, G = 4096, 64, 3, (4 if quick else 8)
    prefix = rand_ids(shared, vocab, 7)
    rows, res = [], {}
    for on in (False, True):
        with make_engine(prefix_cache=on) as e:
            e.generate(rand_ids(256, vocab, 8), SamplingParams(max_tokens=1))  # warm-up
            ttft(e, prefix + rand_ids(tail, vocab, 9))  # the first request computes (and stores) the prefix
            t = statistics.median(ttft(e, prefix + rand_ids(tail, vocab, 10 + i)) for i in range(reps))
            task = rand_ids(shared, vocab, 20)
            params = [
                SamplingParams(max_tokens=8, temperature=1.0, seed=s, ignore_eos=True) for s in range(G)
            ]
            t0 = time.perf_counter()
            e.generate_batch([task] * G, params)
            group_s = time.perf_counter() - t0
            s = e.stats()
        key = "on" if on else "off"
        res[key] = {"ttft_s": t, "group_s": group_s, "tokens_reused": s.get("prefix_tokens_reused", 0)}
    off, on = res["off"], res["on"]
    rows.append([f"TTFT s, {shared}-token shared prefix + {tail}, no prefix reuse", off["ttft_s"], "", ""])
    rows.append([f"TTFT s, {shared}-token shared prefix + {tail}, prefix reuse", on["ttft_s"], "", ""])
    rows.append(["TTFT speed-up from prefix reuse", off["ttft_s"] / on["ttft_s"], "", ""])
    rows.append([f"group of {G} samples of one {shared}-token task, s, no reuse", off["group_s"], "", ""])
    rows.append([f"group of {G} samples of one {shared}-token task, s, prefix reuse", on["group_s"], "", ""])
    return rows, res


def prefix_turn_rows(
    make_engine: MakeEngine, rand_ids: Callable, vocab: int, quick: bool
) -> tuple[list[Row], dict]:
    """Token-granular hits and multi-turn reuse: the prefix restored for a prompt sharing ``p`` tokens
    with a stored one (offsets 0..64, short prompts), the snapshot memory per stored token, and time to
    first token per turn of a chat whose turns each add ~300 tokens, with and without prefix reuse."""
    rows, res = [], {"hits": {}, "turns": {}}
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    base = rand_ids(200, vocab, 40)
    with make_engine(prefix_cache=True) as e:
        e.generate(base, one)
        bytes_per_token = e.budget.snapshot_bytes / (len(base) - 1)
        for p in range(65):
            c = e.generate(base[:p] + [(base[p] + 1) % vocab or 3] + rand_ids(4, vocab, 50 + p), one)
            res["hits"][p] = c.cached_tokens
        for n in (17, 20, 31):  # shorter than the old 64-token block
            short = rand_ids(n, vocab, 60 + n)
            e.generate(short, one)
            res["hits"][f"short {n}"] = e.generate(
                short[:-1] + [(short[-1] + 1) % vocab or 3], one
            ).cached_tokens
    res["snapshot_bytes_per_token"] = bytes_per_token
    offs = (0, 1, 15, 16, 17, 31, 32, 40, 63, 64)
    rows.append(
        [
            "prefix hit / shared tokens at " + ", ".join(map(str, offs)),
            " ".join(str(res["hits"][p]) for p in offs),
            "",
            "",
        ]
    )
    rows.append(
        [
            "prefix hit of a 17 / 20 / 31-token prompt sharing all but its last token",
            " ".join(str(res["hits"][f"short {n}"]) for n in (17, 20, 31)),
            "",
            "",
        ]
    )
    ok = all(p - 15 <= h <= p and h % 16 == 0 for p, h in res["hits"].items() if isinstance(p, int))
    res["hit_within_one_chunk_at_every_offset"] = ok
    rows.append(["every offset 0..64: hit is a multiple of 16 in [shared - 15, shared]", str(ok), "", ""])
    rows.append(["prefix snapshot bytes per stored prompt token (block 16)", bytes_per_token, "", ""])
    n_turns, turn_len = (6, 150) if quick else (10, 300)
    for on in (False, True):
        ttfts = []
        with make_engine(prefix_cache=on) as e:
            e.generate(rand_ids(64, vocab, 1), one)  # warm-up
            convo: list[int] = []
            params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
            for t in range(n_turns):
                convo = convo + rand_ids(turn_len, vocab, 70 + t)
                t0 = time.perf_counter()
                h = e.submit(convo, params)
                first, out = None, []
                for ev in h.events():
                    first = first or time.perf_counter()
                    out += ev.token_ids
                ttfts.append((first or time.perf_counter()) - t0)
                convo = convo + out
        res["turns"]["on" if on else "off"] = ttfts
        label = "prefix reuse" if on else "no reuse"
        rows.append(
            [
                f"TTFT s per turn, {n_turns} turns x {turn_len} new tokens, {label}",
                " ".join(f"{x:.3f}" for x in ttfts),
                "",
                "",
            ]
        )
    on = res["turns"]["on"]
    res["last_over_first"] = on[-1] / on[0]
    rows.append(
        [f"TTFT turn {n_turns} / turn 1 with prefix reuse (target <= 1.5)", res["last_over_first"], "", ""]
    )
    return rows, res
