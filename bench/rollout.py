"""Rollout throughput: multi-turn episodes through the engine with kept-cache sessions vs re-prefilling.

Each episode alternates a sampled assistant turn (up to ``TURN`` tokens) and a tool observation of
``OBS`` tokens for ``TURNS`` turns, so a trajectory grows to thousands of tokens. Three ways to run
the same episodes (same seeds, so the same tokens), at 1, 8 and 32 concurrent episodes:

- **session**: each episode keeps its cache row across turns (``serve/session.py``); a turn prefills
  only its observation;
- **prefix**: each turn resubmits the whole trajectory and the prefix cache restores the longest
  block-aligned snapshot (what "snapshot at the end of generation" would approach);
- **re-prefill**: each turn resubmits the whole trajectory and prefills it from scratch.

The three modes reach the same state by different float32 sums (a chunk split at another token, a
restored snapshot), so a sampled token whose draw falls within rounding of a threshold can differ and
its episode then goes its own way: each row says how many episodes match the session ones token for
token and where the others first differ. In float64 the modes give the same tokens
(``tests/bench/test_rollout_modes.py``), so a mismatch there is a bug, not rounding.

Reported: trajectory tokens per second (every token of every finished trajectory / wall time),
generated tokens per second, prompt tokens the engine actually prefilled, and the speed-up of
sessions over re-prefilling, over ``--rounds`` alternating rounds (3; ``--quick``: 1): medians under the
keys one round writes, every round's values under ``rounds``, the per-round speed-up's median and
[min, max] under ``speedup_range``. Model: tiny-preset shapes, random weights, fp32, CPU; the episode
environment accepts any turn (throughput does not depend on what the turns say).
"""

from __future__ import annotations

import argparse
import statistics
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
from longmoe.agent.rollout import RolloutConfig, collect
from longmoe.data.chat import AssistantTurn
from longmoe.envs.base import StepResult
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.engine import Engine, EngineConfig

MODES = ("session", "prefix", "re-prefill")


class EchoEnv:
    """``turns`` turns, each answered by an observation of about ``obs_words`` words."""

    name = "echo"
    tools: list = []

    def __init__(self, turns: int, obs_words: int) -> None:
        self.n, self.words = turns, obs_words

    def reset(self, seed: int) -> list[dict]:
        self.seed, self.t = seed, 0
        return [{"role": "system", "content": "bench"}, {"role": "user", "content": f"task {seed}"}]

    def step(self, turn: AssistantTurn) -> StepResult:
        self.t += 1
        if self.t >= self.n:
            return StepResult([], True, 0.0, {"success": False, "malformed": 0})
        text = " ".join(f"w{(self.seed * 31 + self.t * 7 + i) % 997}" for i in range(self.words))
        return StepResult([{"role": "tool", "content": text}], False)

    def state_key(self) -> str:
        return str(self.t)

    def expert(self) -> AssistantTurn:
        return AssistantTurn("")

    @property
    def horizon(self) -> int:
        return self.n


def engine(mode: str, max_ctx: int, dtype: torch.dtype = torch.float32) -> Engine:
    torch.manual_seed(0)
    cfg = preset("tiny").replace(max_seq_len=max_ctx)
    opts = EngineConfig(
        cache_budget_bytes=8 << 30, prefill_chunk=512, max_batch=32, prefix_cache=mode == "prefix",
        max_context=max_ctx,
    )  # fmt: skip
    return Engine(LongMoE(cfg).to(dtype), bench_tokenizer(cfg.vocab_size), opts)


def agreement(ref: list[list[int]], got: list[list[int]]) -> dict:
    """How many episodes equal the reference token for token, and where each other one first differs."""
    diverged = []
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        if a != b:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            diverged.append({"episode": i, "first_diff_token": at, "tokens": [len(a), len(b)]})
    return {"identical": len(ref) - len(diverged), "episodes": len(ref), "diverged": diverged}


def run_mode(
    mode: str, n_eps: int, turns: int, obs_words: int, turn_tokens: int, max_ctx: int,
    dtype: torch.dtype = torch.float32,
) -> dict:  # fmt: skip
    rcfg = RolloutConfig(
        group_size=1, max_turn_tokens=turn_tokens, max_episode_tokens=max_ctx - 1,
        sessions=mode == "session", seed=1,
    )  # fmt: skip
    with engine(mode, max_ctx, dtype) as e:
        collect(e, lambda i: EchoEnv(2, 8), [0], rcfg)  # warm-up
        before = e.stats()
        t0 = time.perf_counter()
        trajs = collect(e, lambda i: EchoEnv(turns, obs_words), list(range(n_eps)), rcfg)
        wall = time.perf_counter() - t0
        after = e.stats()
    tokens = sum(len(t.ids) for t in trajs)
    gen = sum(t.policy_tokens for t in trajs)
    prefilled = sum(u.prefilled for t in trajs for u in t.turns)
    assert after["prompt_tokens"] >= before["prompt_tokens"]
    return {
        "mode": mode,
        "episodes": n_eps,
        "wall_s": wall,
        "tokens": tokens,
        "generated": gen,
        "prefilled": prefilled,
        "tok_s": tokens / wall,
        "gen_tok_s": gen / wall,
        "ids": [t.ids for t in trajs],
    }


def one_round(
    rnd: int, concurrency: list[int], turns: int, obs_words: int, turn_tokens: int, max_ctx: int
) -> dict:
    """Every episode count once, its three modes back to back (their order reversed in odd rounds):
    ``{(episodes, mode): run}``, each run with its agreement with the session run and its speed-up over
    re-prefilling in this round."""
    out: dict = {}
    order = MODES if rnd % 2 == 0 else MODES[::-1]
    for n in concurrency:
        by_mode = {m: run_mode(m, n, turns, obs_words, turn_tokens, max_ctx) for m in order}
        ref = by_mode["session"]["ids"]
        base = by_mode["re-prefill"]["tok_s"]
        for m in MODES:
            r = by_mode[m]
            r["same_as_session"] = agreement(ref, r["ids"])
            r["speedup_vs_reprefill"] = r["tok_s"] / base
        for m in MODES:
            by_mode[m].pop("ids")
            out[(n, m)] = by_mode[m]
        print(f"round {rnd}, {n} episodes:", {m: round(by_mode[m]["tok_s"], 1) for m in MODES}, flush=True)
    return out


PER_ROUND = ("wall_s", "tok_s", "gen_tok_s", "speedup_vs_reprefill", "tokens", "prefilled")


def combine(rounds: list[dict]) -> list[dict]:
    """One row per (episodes, mode) in the first round's order, as one round wrote it, with the timed
    values (wall s, tok/s, the speed-up over re-prefilling) replaced by their medians over rounds; token
    counts and the agreement are the first round's; ``rounds`` keeps every round's values and
    ``speedup_range`` the per-round speed-up's median and [min, max]."""
    rows = []
    for key, first in rounds[0].items():
        per = [r[key] for r in rounds]
        row = dict(first)
        for k in ("wall_s", "tok_s", "gen_tok_s"):
            row[k] = statistics.median(p[k] for p in per)
        row["speedup_range"] = spread([p["speedup_vs_reprefill"] for p in per])
        row["speedup_vs_reprefill"] = row["speedup_range"]["median"]
        row["rounds"] = [
            {**{k: p[k] for k in PER_ROUND}, "identical_to_session": p["same_as_session"]["identical"]}
            for p in per
        ]
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short episodes, 1 and 8 episodes (a minute)")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README table")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    add_rounds_option(ap)
    args = ap.parse_args()
    rounds = rounds_arg(ap, args)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    turns, obs_words, turn_tokens = (4, 60, 16) if args.quick else (8, 150, 24)
    concurrency = [1, 8] if args.quick else [1, 8, 32]
    max_ctx = 8192
    with torch.inference_mode():
        per = [one_round(i, concurrency, turns, obs_words, turn_tokens, max_ctx) for i in range(rounds)]
    results = combine(per)
    rows = []
    for r in results:
        same = r["same_as_session"]
        rows.append([r["episodes"], r["mode"], r["tokens"] // r["episodes"], r["prefilled"], r["wall_s"],
                     range_cell(spread([p["tok_s"] for p in r["rounds"]]), ".4g"), r["gen_tok_s"],
                     range_cell(r["speedup_range"]), f"{same['identical']}/{same['episodes']}"])  # fmt: skip
    header = ["episodes", "mode", "tokens/episode", "prefilled tokens", "wall s", "trajectory tok/s",
              "generated tok/s", "× re-prefill", "episodes = session's"]  # fmt: skip
    table = markdown_table(header, rows)
    table += (
        f"\n\n{turns} turns per episode (≤ {turn_tokens} sampled tokens each, observations of {obs_words}"
        f" words); {rounds} alternating rounds (each runs every episode count, its three modes back to back):"
        " wall s and generated tok/s are medians, trajectory tok/s and × re-prefill median [min, max] over"
        " rounds (× re-prefill: of the per-round ratio); the last column counts the first round's episodes"
        " whose tokens equal the session run's (float32 rounding can flip a sampled token; the JSON says"
        f" where). CPU, fp32, {torch.get_num_threads()} thread(s), shared machine; tiny-preset shapes, random"
        " weights."
    )
    name = "rollout_quick" if args.quick else "rollout"
    cfg = {"turns": turns, "obs_words": obs_words, "turn_tokens": turn_tokens, "quick": args.quick}
    write_results(
        name,
        {"config": cfg, "n_rounds": rounds, "rows": results},
        table,
        update_readme=not (args.no_readme or args.quick),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
