"""Long-horizon rollouts: horizon-32 agent episodes (about 30K tokens each) through the engine with
and without sessions, and through the HTTP server with tools.

The episodes are the long-horizon suite's ``doclookup`` (``envs/suites.py``: 2,000-character pages,
16 distractors, 2 corrected records, results capped at 2,400 characters), driven by the expert
(``envs/forced.py``): the model is the tiny preset with random weights, which cannot play the task, so
each turn samples up to ``TURN`` tokens that are then replaced by the expert's move in the
environment while the trajectory keeps the sampled tokens and the real observations. Modes:

- **session**: each episode keeps its cache row across turns (``serve/session.py``); a turn prefills
  only its observation;
- **re-prefill**: each turn resubmits the whole trajectory, prefilled from scratch (no prefix cache);
- **http**: one episode through longmoe's OpenAI-compatible server with ``tools`` (a function-calling
  client sending the expert's transcript so far each turn; the server's prefix cache on, as served).

Reported per mode: tokens and turns per episode, prompt tokens prefilled, wall seconds in all and per
episode, trajectory tokens/s (every token of every finished trajectory / wall), generated tokens/s,
and the memory a live episode holds: its kept cache row at the episode's final length
(``CacheBudget.spec.bytes_for``: the fixed recurrent state plus the latent MLA cache per token).
CPU, fp32; the machine is shared with other jobs (say so beside any number).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

from bench.common import bench_tokenizer, markdown_table, write_results
from longmoe.agent.rollout import RolloutConfig, collect
from longmoe.envs import make_env
from longmoe.envs.forced import ExpertForced
from longmoe.envs.suites import LONG
from longmoe.eval.agent.harness import run_episode
from longmoe.eval.agent.policies import EndpointAgent, ExpertForcedAgent
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.api import create_app, serve_in_thread
from longmoe.serve.engine import Engine, EngineConfig

TURN = 24  # tokens sampled per assistant turn
CTX = 65_536


def make_engine(sessions: bool, tok, threads_engine: bool = False) -> Engine:
    torch.manual_seed(0)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, max_seq_len=CTX)
    opts = EngineConfig(
        cache_budget_bytes=8 << 30, prefill_chunk=1024, max_batch=16, prefix_cache=False, max_context=CTX
    )
    return Engine(LongMoE(cfg).eval(), tok, opts)


def env_fields(horizon: int, page_chars: int | None) -> dict:
    f = {**LONG["doclookup"], "horizon": horizon}
    if page_chars is not None:
        f["page_chars"] = page_chars
        f["max_result_chars"] = page_chars + 400
    return f


def run_engine(mode: str, n: int, fields: dict, tok) -> dict:
    cfg = RolloutConfig(
        group_size=1, max_turn_tokens=TURN, max_episode_tokens=CTX - 1, sessions=mode == "session", seed=1
    )
    with make_engine(mode == "session", tok) as e:
        collect(
            e, lambda i: ExpertForced(make_env("doclookup", horizon=1, page_chars=200)), [0], cfg
        )  # warm-up
        t0 = time.perf_counter()
        trajs = collect(e, lambda i: ExpertForced(make_env("doclookup", **fields)), list(range(n)), cfg)
        wall = time.perf_counter() - t0
        spec = e.budget.spec
    assert all(t.success and not t.truncated for t in trajs), "an episode did not reach its end"
    lengths = [len(t.ids) for t in trajs]
    return {
        "mode": mode,
        "episodes": n,
        "wall_s": wall,
        "wall_s_per_episode": wall / n,
        "tokens": sum(lengths),
        "tokens_per_episode": statistics.mean(lengths),
        "turns_per_episode": statistics.mean(len(t.turns) for t in trajs),
        "generated": sum(t.policy_tokens for t in trajs),
        "prefilled": sum(u.prefilled for t in trajs for u in t.turns),
        "tok_s": sum(lengths) / wall,
        "gen_tok_s": sum(t.policy_tokens for t in trajs) / wall,
        "episode_bytes": spec.bytes_for(max(lengths)),
        "fixed_bytes": spec.fixed,
        "per_token_bytes": spec.per_token,
        "ids": [t.ids for t in trajs],
    }


def run_http(fields: dict, tok) -> dict:
    torch.manual_seed(0)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, max_seq_len=CTX)
    engine = Engine(
        LongMoE(cfg).eval(),
        tok,
        EngineConfig(cache_budget_bytes=8 << 30, prefill_chunk=1024, max_context=CTX),
    )
    srv, th, port = serve_in_thread(create_app(engine, model_name="tiny"))
    try:
        agent = ExpertForcedAgent(EndpointAgent(f"http://127.0.0.1:{port}/v1", "tiny", timeout=600))
        t0 = time.perf_counter()
        r = run_episode(agent, make_env("doclookup", **fields), 0, max_tokens=TURN)
        wall = time.perf_counter() - t0
        stats = engine.stats()
    finally:
        srv.should_exit = True
        th.join(timeout=30)
        engine.close()
    assert r.success
    gen = sum(x.completion_tokens or 0 for x in agent.replies)
    tokens = (agent.replies[-1].prompt_tokens or 0) + (agent.replies[-1].completion_tokens or 0)
    return {
        "mode": "http",
        "episodes": 1,
        "wall_s": wall,
        "wall_s_per_episode": wall,
        "tokens": tokens,
        "tokens_per_episode": tokens,
        "turns_per_episode": r.turns,
        "generated": gen,
        "prefilled": stats.get("prompt_tokens", 0) - stats.get("prefix_hit_tokens", 0),
        "tok_s": tokens / wall,
        "gen_tok_s": gen / wall,
        "episode_bytes": None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="horizon 8, 500-character pages (a minute or two)")
    ap.add_argument("--horizon", type=int, default=None, help="episode horizon (default 32; 8 with --quick)")
    ap.add_argument(
        "--episodes", default=None, help="concurrent episodes per engine row, e.g. 1,4 (default 1)"
    )
    ap.add_argument(
        "--page-chars", type=int, default=None, help="doclookup page size (default 2000; 500 with --quick)"
    )
    ap.add_argument("--no-http", action="store_true", help="skip the HTTP-server row")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    horizon = args.horizon or (8 if args.quick else 32)
    fields = env_fields(horizon, args.page_chars or (500 if args.quick else None))
    counts = [int(x) for x in (args.episodes or "1").split(",")]
    tok = bench_tokenizer(2048)
    results = []
    with torch.inference_mode():
        for n in counts:
            by_mode = {m: run_engine(m, n, fields, tok) for m in ("session", "re-prefill")}
            assert by_mode["session"]["ids"] == by_mode["re-prefill"]["ids"], "modes sampled different tokens"
            for m in by_mode.values():
                m.pop("ids")
                m["speedup_vs_reprefill"] = m["tok_s"] / by_mode["re-prefill"]["tok_s"]
                results.append(m)
    if not args.no_http:
        results.append(run_http(fields, tok))
    rows = []
    for r in results:
        mem = "-" if r["episode_bytes"] is None else f"{r['episode_bytes'] / 2**20:.2f}"
        rows.append(
            [
                r["mode"],
                r["episodes"],
                round(r["tokens_per_episode"]),
                round(r["turns_per_episode"], 1),
                r["prefilled"],
                r["wall_s"],
                r["wall_s_per_episode"],
                r["tok_s"],
                r["gen_tok_s"],
                r.get("speedup_vs_reprefill", "-"),
                mem,
            ]
        )
    header = [
        "mode",
        "episodes",
        "tokens/episode",
        "turns/episode",
        "prefilled tokens",
        "wall s",
        "wall s/episode",
        "trajectory tok/s",
        "generated tok/s",
        "× re-prefill",
        "MiB held/episode",
    ]
    r0 = results[0]
    table = markdown_table(header, rows) + (
        f"\n\ndoclookup horizon {horizon} (long suite: {fields['page_chars']}-character pages, "
        f"{fields['distractors']} distractors, {fields['corrections']} corrections), expert-driven "
        f"episodes, ≤ {TURN} sampled tokens per turn; session and re-prefill sampled identical tokens "
        f"(asserted). Memory held per live episode = its kept cache row at the final length: "
        f"{r0['fixed_bytes'] / 2**10:.0f} KiB fixed (recurrent state) + {r0['per_token_bytes']} bytes/token "
        f"(latent MLA cache). CPU, fp32, {torch.get_num_threads()} thread(s); tiny-preset shapes, random "
        "weights; measured under contention (a 2-core machine shared with other jobs): single samples."
    )
    name = "rollout_long_quick" if args.quick else "rollout_long"
    cfg = {"horizon": horizon, "env": fields, "turn_tokens": TURN, "episodes": counts, "quick": args.quick}
    write_results(
        name, {"config": cfg, "rows": results}, table, update_readme=not (args.no_readme or args.quick)
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
