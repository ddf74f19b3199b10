"""Rows of ``bench/serve.py`` for prefix reuse and speculative decoding, each against the same engine
without it (same model, same run).

- **prefix reuse**: time to first token of a request whose prompt is a 4K-token shared prefix (a
  system prompt, a long document) plus a 64-token tail, after one earlier request with that prefix;
  and the wall time of an RL-style group (``G`` samples of one 4K-token task submitted together).
- **speculative decoding**: greedy decode tokens/s with a draft made of the target's first layers
  (``truncated_draft``), by ``k``, at batch 1 and 8, and with an unrelated random draft (the worst case:
  nearly every draft rejected); acceptance rate, and the share of decode time spent rolling rejected
  rows back (snapshot + replay). Outputs are checked identical to plain decoding.
  Random weights make the acceptance rate a property of this random model, not of a trained pair:
  the rows measure the mechanism (what a verify, a draft step and a replay cost).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from longmoe.model import LongMoE
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.speculative import truncated_draft

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


def spec_rows(make_engine: MakeEngine, rand_ids: Callable, vocab: int, quick: bool) -> tuple[list[Row], dict]:
    n_tok, draft_layers = (32 if quick else 64), 2
    params = SamplingParams(max_tokens=n_tok, temperature=0.0, ignore_eos=True)
    rows, res = [], []
    for batch in (1, 8):
        prompts = [rand_ids(32, vocab, 300 + i) for i in range(batch)]
        base = None
        for k, kind in ((0, ""), (1, "trunc"), (3, "trunc"), (5, "trunc"), (3, "random")):
            with make_engine() as plain:
                model, tok, cfg = plain.model, plain.tokenizer, plain.cfg
            draft = None
            if kind == "trunc":
                draft = truncated_draft(model, draft_layers)
            elif kind == "random":  # shares nothing with the target: nearly every draft is rejected
                torch.manual_seed(1)
                draft = LongMoE(truncated_draft(model, draft_layers).cfg).eval()
            cfg.num_speculative_tokens = max(k, 1)
            with Engine(model, tok, cfg, draft=draft) as e:
                e.generate(prompts[0][:8], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
                t0 = time.perf_counter()
                out = [c.token_ids for c in e.generate_batch(prompts, params)]
                dt = time.perf_counter() - t0
            s = e.stats()
            tps = batch * n_tok / dt
            if base is None:
                base = (tps, out)
                rows.append([f"decode tok/s, batch {batch}, no speculation", tps, "", ""])
                res.append({"batch": batch, "k": 0, "tok_s": tps})
                continue
            assert out == base[1], "speculative greedy output differs from plain decoding"
            entry = {
                "draft": kind,
                "batch": batch,
                "k": k,
                "tok_s": tps,
                "speedup": tps / base[0],
                "acceptance": s["spec_acceptance_rate"],
                "tokens_per_row_step": s["spec_tokens_per_row_step"],
                "replay_share": s["spec_replay_s"] / dt,
            }
            res.append(entry)
            name = f"first {draft_layers}/8 layers" if kind == "trunc" else f"random {draft_layers}-layer"
            label = f"speculative k={k} (draft: {name}), batch {batch}"
            rows.append([f"{label}: tok/s", tps, "", ""])
            rows.append([f"{label}: speed-up vs no speculation", entry["speedup"], "", ""])
            rows.append([f"{label}: acceptance rate", entry["acceptance"], "", ""])
            rows.append([f"{label}: share of time in rollback replay", entry["replay_share"], "", ""])
            print(rows[-4:], flush=True)
    return rows, {"draft_layers": draft_layers, "tokens": n_tok, "runs": res}


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
