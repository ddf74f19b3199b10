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

from bench.common import range_cell, spread
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams

Row = list
MakeEngine = Callable[..., Engine]
SHARED, TAIL = 4096, 64  # prefix reuse: shared prefix and new tail tokens


def ttft(engine: Engine, prompt: list[int]) -> float:
    t0 = time.perf_counter()
    h = engine.submit(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    first = None
    for _ in h.events():
        first = first or time.perf_counter()
    return (first or time.perf_counter()) - t0


def _prefix_arm(make_engine: MakeEngine, rand_ids: Callable, vocab: int, on: bool, G: int, r: int) -> dict:
    """One arm of one round on a fresh engine: TTFT after the shared prefix (median of 3 new tails; the
    first request computes, and with reuse stores, the prefix) and the wall time of a group on a new task."""
    shared, tail, reps = SHARED, TAIL, 3
    prefix = rand_ids(shared, vocab, 7)
    with make_engine(prefix_cache=on) as e:
        e.generate(rand_ids(256, vocab, 8), SamplingParams(max_tokens=1))  # warm-up
        ttft(e, prefix + rand_ids(tail, vocab, 9))
        t = statistics.median(ttft(e, prefix + rand_ids(tail, vocab, 10 + 10 * r + i)) for i in range(reps))
        task = rand_ids(shared, vocab, 20 + r)
        params = [SamplingParams(max_tokens=8, temperature=1.0, seed=s, ignore_eos=True) for s in range(G)]
        t0 = time.perf_counter()
        e.generate_batch([task] * G, params)
        group_s = time.perf_counter() - t0
        s = e.stats()
    return {"ttft_s": t, "group_s": group_s, "tokens_reused": s.get("prefix_tokens_reused", 0)}


def prefix_rows(
    make_engine: MakeEngine, rand_ids: Callable, vocab: int, quick: bool, rounds: int = 1
) -> tuple[list[Row], dict]:
    """Prefix reuse against the same engine without it, ``rounds`` rounds (the arms' order alternates
    between rounds): each arm's median over rounds under ``off``/``on`` as one round wrote them, the
    per-round values under ``rounds``, and the per-round speed-ups' median and [min, max]."""
    G = 4 if quick else 8
    per: list[dict] = []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {("on" if on else "off"): _prefix_arm(make_engine, rand_ids, vocab, on, G, r) for on in order}
        per.append(got)
        print(f"prefix reuse round {r}:", got, flush=True)
    res: dict = {
        arm: {k: statistics.median(p[arm][k] for p in per) for k in ("ttft_s", "group_s", "tokens_reused")}
        for arm in ("off", "on")
    }
    res["ttft_speedup"] = spread([p["off"]["ttft_s"] / p["on"]["ttft_s"] for p in per])
    res["group_speedup"] = spread([p["off"]["group_s"] / p["on"]["group_s"] for p in per])
    res["rounds"] = per
    ttft_s = {a: spread([p[a]["ttft_s"] for p in per]) for a in ("off", "on")}
    group_s = {a: spread([p[a]["group_s"] for p in per]) for a in ("off", "on")}
    head = f"{SHARED}-token shared prefix + {TAIL}"
    rows = [
        [f"TTFT s, {head}, no prefix reuse", range_cell(ttft_s["off"], ".3g"), "", ""],
        [f"TTFT s, {head}, prefix reuse", range_cell(ttft_s["on"], ".3g"), "", ""],
        ["TTFT speed-up from prefix reuse, per-round", range_cell(res["ttft_speedup"]), "", ""],
        [
            f"group of {G} samples of one {SHARED}-token task, s, no reuse",
            range_cell(group_s["off"], ".3g"),
            "",
            "",
        ],
        [
            f"group of {G} samples of one {SHARED}-token task, s, prefix reuse",
            range_cell(group_s["on"], ".3g"),
            "",
            "",
        ],
        ["group speed-up from prefix reuse, per-round", range_cell(res["group_speedup"]), "", ""],
    ]
    return rows, res


def prefix_turn_rows(
    make_engine: MakeEngine, rand_ids: Callable, vocab: int, quick: bool, rounds: int = 1
) -> tuple[list[Row], dict]:
    """Token-granular hits and multi-turn reuse: the prefix restored for a prompt sharing ``p`` tokens
    with a stored one (offsets 0..64, short prompts), the snapshot memory per stored token, and time to
    first token per turn of a chat whose turns each add ~300 tokens, with and without prefix reuse, in
    ``rounds`` rounds (a fresh engine per arm and round; the arms' order alternates between rounds):
    ``turns`` holds each turn's median over rounds, ``turns_rounds`` every round's, ``last_over_first``
    the median over rounds of the last turn / the first with reuse (``last_over_first_range``: [min, max];
    ``off_last_over_first_range``: the same without reuse)."""
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
    per: dict[str, list[list[float]]] = {"off": [], "on": []}
    for r in range(rounds):
        for on in (False, True) if r % 2 == 0 else (True, False):
            per["on" if on else "off"].append(
                _chat_ttfts(make_engine, rand_ids, vocab, on, n_turns, turn_len)
            )
    res["turns_rounds"] = per
    res["turns"] = {arm: [statistics.median(x) for x in zip(*runs, strict=True)] for arm, runs in per.items()}
    for arm, label in (("off", "no reuse"), ("on", "prefix reuse")):
        rows.append(
            [f"TTFT s per turn, {n_turns} turns x {turn_len} new tokens, {label} (medians)",
             " ".join(f"{x:.3f}" for x in res["turns"][arm]), "", ""]
        )  # fmt: skip
    res["off_last_over_first_range"] = spread([t[-1] / t[0] for t in per["off"]])
    res["last_over_first_range"] = spread([t[-1] / t[0] for t in per["on"]])
    res["last_over_first"] = res["last_over_first_range"]["median"]
    rows.append(
        [f"TTFT turn {n_turns} / turn 1 with prefix reuse, per-round (target <= 1.5)",
         range_cell(res["last_over_first_range"]), "", ""]
    )  # fmt: skip
    rows.append(
        [
            f"TTFT turn {n_turns} / turn 1 without reuse, per-round",
            range_cell(res["off_last_over_first_range"]),
            "",
            "",
        ]
    )
    return rows, res


def _chat_ttfts(
    make_engine: MakeEngine, rand_ids: Callable, vocab: int, on: bool, n_turns: int, turn_len: int
) -> list[float]:
    """Time to first token of each turn of one chat on a fresh engine (each turn adds ``turn_len`` new
    tokens and the previous reply)."""
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
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
    return ttfts
