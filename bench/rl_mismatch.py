"""Rollout/trainer log-prob mismatch: what the engine reports for the sampled tokens vs what the trainer
computes for the same tokens (max and mean ``|Δ log p|`` over policy tokens), and where it comes from.

The engine decodes token by token (the recurrent KDA step, absorbed MLA attention against the latent
cache, rows batched with other episodes, observations prefilled in chunks on top of a kept row or a
prefix snapshot); the trainer runs the whole trajectory at once (chunked KDA, full causal MLA, MoE
in train mode). Both are exact in real arithmetic and differ in float order. Rows:

- **before**: engine log-probs vs the trainer's forward, per model kind (hybrid ``LLLM``, KDA-only,
  MLA-only) to attribute the mismatch to a mixer, and per engine setting (default batching with prefix
  reuse; one row at a time without prefix reuse: batch composition and snapshot boundaries out;
  naive MLA decode);
- **after**: the log-probs PPO's ratio is taken against, recomputed by the update's own forward
  (``RLTrainer.trainer_logprobs``), vs the update's forward: 0 bit for bit (asserted); the engine's
  sampling distribution keeps the "before" mismatch, which the TIS weights correct. Its cost: the
  recompute's seconds against the rollout's.

Model: tiny-preset shapes, random weights moved off init, fp32, CPU; episodes of an environment
that accepts any turn.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from bench.common import bench_tokenizer, markdown_table, write_results
from bench.rollout import EchoEnv
from longmoe.agent.rollout import RolloutConfig, collect
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.rl.trainer import token_logprobs, token_tensors
from longmoe.serve.engine import Engine, EngineConfig

NUDGE = 0.05  # N(0, 1) noise scale added to every weight (as the tests' tiny models)
KINDS = {"hybrid LLLM": "LLLM", "KDA only": "L", "MLA only": "M"}
SETTINGS = {  # engine options, MLA decode path
    "batched + prefix reuse": ({"max_batch": 32, "prefix_cache": True}, "absorbed"),
    "one row at a time, no prefix reuse": ({"max_batch": 1, "prefix_cache": False}, "absorbed"),
    "batched, naive MLA decode": ({"max_batch": 32, "prefix_cache": True}, "naive"),
}


def trainer_forward(model: LongMoE, ids: torch.Tensor) -> torch.Tensor:
    """The update's forward (train mode, grad enabled), detached; balancer counts discarded."""
    model.train()
    with torch.enable_grad():
        lp = token_logprobs(model, ids).detach()
    for layer in model.moe_layers():
        layer.discard_step_counts()
    model.eval()
    return lp


def measure(kind: str, setting: str, tasks: int, group: int, turns: int, words: int, tokens: int) -> dict:
    torch.manual_seed(0)
    cfg = preset("tiny").replace(layer_pattern=KINDS[kind], max_seq_len=4096)
    opts, mla = SETTINGS[setting]
    model = LongMoE(cfg)
    with torch.no_grad():  # off init (norms at 1, gates at 0), so the distributions are not near-flat
        for p in model.parameters():
            p.add_(torch.randn_like(p) * NUDGE)
    model.set_mla_decode(mla)
    rcfg = RolloutConfig(group_size=group, max_turn_tokens=tokens, max_episode_tokens=4000, seed=3)
    eng = EngineConfig(cache_budget_bytes=4 << 30, prefill_chunk=64, max_context=4096, **opts)
    with Engine(model, bench_tokenizer(cfg.vocab_size), eng) as e:
        t0 = time.perf_counter()
        with torch.inference_mode():
            trajs = collect(e, lambda i: EchoEnv(turns, words), list(range(tasks)), rcfg)
        rollout_s = time.perf_counter() - t0
    m = token_tensors(trajs)
    t0 = time.perf_counter()
    old = trainer_forward(model, m["input_ids"])  # the recompute
    recompute_s = time.perf_counter() - t0
    upd = trainer_forward(model, m["input_ids"])  # what the update's first forward computes
    mask = m["mask"]
    before = (old - m["old_logp"])[mask].abs()
    after = (upd - old)[mask].abs()
    assert float(after.max()) == 0.0, "the recompute must equal the update's forward bit for bit"
    return {
        "model": kind,
        "engine": setting,
        "policy_tokens": int(mask.sum()),
        "before_max": float(before.max()),
        "before_mean": float(before.mean()),
        "bitwise_equal_share": float((before == 0).float().mean()),
        "after_max": float(after.max()),
        "after_mean": float(after.mean()),
        "rollout_s": rollout_s,
        "recompute_s": recompute_s,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few short episodes (about a minute)")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README table")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    tasks, group, turns, words, tokens = (2, 4, 3, 30, 16) if args.quick else (4, 8, 6, 100, 24)
    runs = [(k, next(iter(SETTINGS))) for k in KINDS] + [("hybrid LLLM", s) for s in list(SETTINGS)[1:]]
    results, rows = [], []
    for kind, setting in runs:
        r = measure(kind, setting, tasks, group, turns, words, tokens)
        results.append(r)
        rows.append([r["model"], r["engine"], r["policy_tokens"], f"{r['before_max']:.2e}",
                     f"{r['before_mean']:.2e}", f"{r['bitwise_equal_share']:.2f}", f"{r['after_max']:.0e}",
                     f"{r['rollout_s']:.1f}", f"{r['recompute_s']:.2f}"])  # fmt: skip
    header = ["model", "engine", "policy tokens", "before: max abs Δ log p", "before: mean",
              "bitwise-equal share", "after: max", "rollout s", "recompute s"]  # fmt: skip
    table = markdown_table(header, rows)
    table += (
        f"\n\nbefore: engine (rollout) log-probs vs the trainer's forward; after: the PPO ratio's "
        f"denominator (the trainer's recompute) vs the update's forward (asserted 0). {tasks} tasks x "
        f"{group} episodes, {turns} turns of <= {tokens} tokens, observations of {words} words. CPU, fp32, "
        f"{torch.get_num_threads()} thread(s); tiny-preset shapes, random weights off init."
    )
    name = "rl_mismatch_quick" if args.quick else "rl_mismatch"
    cfg = {"tasks": tasks, "group": group, "turns": turns, "obs_words": words, "turn_tokens": tokens}
    write_results(
        name, {"config": {**cfg, "quick": args.quick}, "rows": results}, table,
        update_readme=not (args.no_readme or args.quick),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
