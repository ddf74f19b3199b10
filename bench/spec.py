"""Speculative decoding on a trained target: acceptance and speed-up per draft, ``k`` and batch size.

A random target says nothing about speculation (its argmax mostly repeats the input token, so any
draft that predicts "repeat" is accepted). Here the target is a trained model (``--model``, default
the demo run ``runs/demo``) and the drafts are made by longmoe's own pipelines:

- **trained 2-layer**: a 2-layer model of the target's shapes, pretrained through the same curriculum
  with the target's tokenizer (``--draft-run`` reuses one; otherwise it is trained here);
- **first 2 layers, distilled**: the target's first 2 layers (``truncated_draft``) after a short
  distillation on the target's own next-token distribution (``longmoe.train.distill``);
- **first 2 layers** as cut, untrained (the free draft).

Prompts are 64-token windows of held-out documents (the corpus' validation split); every speculative
run's greedy output is checked token-for-token equal to plain decoding. Timing: ``--rounds`` rounds,
each one plain and one speculative run back to back, so a burst of other load hits both; the speed-up
is the median of the per-round ratios, with their range.

    python -m bench.spec --model runs/demo
    python -m bench.spec --quick      # trains a small target and drafts here (a smoke run)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from bench.common import markdown_table, write_results
from longmoe.checkpoint import load_model
from longmoe.data.tokenizer import Tokenizer
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.speculative import truncated_draft
from longmoe.train.config import TrainConfig, tiny_curriculum
from longmoe.train.distill import DistillConfig, corpus_tokens, distill
from longmoe.train.pretrain import Trainer
from longmoe.train.run import train_tokenizer

DRAFT_LAYERS = 2
PROMPT_LEN = 64


def train_run(
    run_dir: Path, model: LongMoE | None, tok: Tokenizer | None, scale: float, n_layers: int
) -> Path:
    """Pretrain a ``n_layers`` model through the tiny curriculum (the target's shapes and tokenizer)."""
    cfg = model.cfg if model is not None else preset("tiny")
    cfg = cfg.replace(
        n_layers=n_layers,
        layer_pattern="".join(cfg.layer_types[:n_layers]),
        attn_res_blocks=min(cfg.attn_res_blocks, n_layers),
    )
    tok = tok or train_tokenizer(cfg.vocab_size, max_chars=2_000_000)
    tcfg = TrainConfig(stages=tiny_curriculum(scale, synthetic=False), eval_every=0, ckpt_every=0)
    t0 = time.perf_counter()
    Trainer(run_dir, cfg, tcfg, tok, progress=False).fit()
    print(f"trained {n_layers}-layer model in {time.perf_counter() - t0:.0f} s -> {run_dir}", flush=True)
    return run_dir


def held_out_prompts(tok: Tokenizer, n: int) -> list[list[int]]:
    """``n`` prompts of ``PROMPT_LEN`` tokens from the validation split, from different documents."""
    ids = corpus_tokens(tok, n * 512, split="val").tolist()
    return [ids[i * 512 : i * 512 + PROMPT_LEN] for i in range(n)]


def timed(
    engine: Engine, prompts: list[list[int]], params: SamplingParams, counters: bool = False
) -> tuple[float, tuple[list[list[int]], dict[str, float]]]:
    """Wall time of one ``generate_batch``; its outputs, and (``counters``) the speculation counters it
    moved (proposed, accepted, row-steps)."""
    before = engine.stats()
    t0 = time.perf_counter()
    out = [c.token_ids for c in engine.generate_batch(prompts, params)]
    dt = time.perf_counter() - t0
    moved = {}
    if counters:
        after = engine.stats()
        moved = {k: after[f"spec_{k}"] - before[f"spec_{k}"] for k in ("proposed", "accepted", "row_steps")}
    return dt, (out, moved)


def summarize(draft: str, k: int, batch: int, case: str, pairs: list, tokens: int) -> dict:
    """One cell from its rounds ``(plain s, speculative s, counters)``: acceptance over the cell's own
    rounds, speed-up = median of per-round plain/speculative time ratios, with their range."""
    ratios = [p / s for p, s, _ in pairs]
    prop = sum(c["proposed"] for *_, c in pairs)
    acc = sum(c["accepted"] for *_, c in pairs)
    return {
        "draft": draft,
        "k": k,
        "batch": batch,
        "case": case,
        "acceptance": acc / prop if prop else 0.0,
        "tokens_per_step": (acc + (rs := sum(c["row_steps"] for *_, c in pairs))) / max(1, rs),
        "speedup_median": statistics.median(ratios),
        "speedup_rounds": ratios,
        "plain_tok_s": statistics.median(batch * tokens / p for p, *_ in pairs),
        "spec_tok_s": statistics.median(batch * tokens / s for _, s, _ in pairs),
    }


def row(e: dict) -> list:
    r = e["speedup_rounds"]
    verdict = "wins" if min(r) > 1 else ("loses" if max(r) < 1 else "within noise")
    return [e["draft"], e["k"], e["batch"], e["case"], e["acceptance"], e["tokens_per_step"],
            e["speedup_median"], f"{min(r):.2f}–{max(r):.2f}", verdict]  # fmt: skip


def composition_rows(
    target: LongMoE, tok: Tokenizer, draft: LongMoE, best: dict, prompts: list, args, plain: Engine
) -> list[dict]:
    """The best batch-1 draft and ``k`` with a prefix hit (the prompt's first half was seen before, prefix
    cache on in both arms) and as a session's second turn (the first turn's row kept), greedy output
    checked equal to plain decoding with the same reuse."""
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    out = []
    cfg = dict(max_context=4096, prefix_cache=True)
    with (
        Engine(target, tok, EngineConfig(**cfg)) as base,
        Engine(target, tok, EngineConfig(**cfg, num_speculative_tokens=best["k"]), draft=draft) as spec,
    ):
        pairs = []
        for i in range(args.rounds):  # a prefix hit: the first half of the prompt came before
            p = prompts[i % len(prompts)]
            for e in (base, spec):
                e.generate(p[: PROMPT_LEN // 2] + [tok.eos_id], SamplingParams(max_tokens=1))
            t_plain, ref = timed(base, [p], params)
            t_spec, got = timed(spec, [p], params, counters=True)
            assert got[0] == ref[0], "speculation with a prefix hit differs from plain decoding"
            pairs.append((t_plain, t_spec, got[1]))
        out.append(summarize(best["draft"], best["k"], 1, "prefix hit", pairs, args.tokens))
        pairs = []
        for i in range(args.rounds):  # a session's second turn continues the kept row
            p = prompts[(i + 1) % len(prompts)]
            runs = []
            for e in (base, spec):
                s = e.open_session()
                e.generate(p[: PROMPT_LEN // 2], params, session=s)
                runs.append((timed(e, [p[PROMPT_LEN // 2 :]], params, counters=e is spec), s))
            (t_plain, ref), _ = runs[0]
            (t_spec, got), _ = runs[1]
            assert got[0] == ref[0], "speculation on a session turn differs from plain decoding"
            for e, (_, s) in zip((base, spec), runs, strict=True):
                e.close_session(s)
            pairs.append((t_plain, t_spec, got[1]))
        out.append(summarize(best["draft"], best["k"], 1, "session turn 2", pairs, args.tokens))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="trained target (model or run dir)")
    ap.add_argument("--draft-run", type=Path, default=None, help="2-layer draft run dir (reused if trained)")
    ap.add_argument("--draft-scale", type=float, default=1.0, help="curriculum scale for the 2-layer draft")
    ap.add_argument("--distill-steps", type=int, default=300, help="distillation steps for the cut draft")
    ap.add_argument("--tokens", type=int, default=64, help="generated tokens per request")
    ap.add_argument("--rounds", type=int, default=3, help="alternating plain/speculative rounds")
    ap.add_argument("--quick", action="store_true", help="train a small target here; fewer rows")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    t_start = time.perf_counter()
    if args.model is None:
        if not args.quick:
            ap.error("--model is required (a trained target, e.g. runs/demo), or --quick")
        args.model = train_run(Path(tmp.name) / "target", None, None, 0.05, 8)
    target, tok, _ = load_model(args.model)
    draft_run = args.draft_run or Path(tmp.name) / "draft"
    if not (draft_run / "final").exists():  # train it (into --draft-run, so a rerun reuses it)
        train_run(draft_run, target, tok, 0.05 if args.quick else args.draft_scale, DRAFT_LAYERS)
    drafts: dict[str, LongMoE] = {"trained 2-layer": load_model(draft_run).model}
    cut = truncated_draft(target, DRAFT_LAYERS)
    drafts["first 2 layers"] = cut
    distilled = truncated_draft(target, DRAFT_LAYERS)
    steps = 20 if args.quick else args.distill_steps
    distill_run = draft_run.with_name(f"{draft_run.name}-distilled")  # resumes; a rerun reuses it
    tokens = corpus_tokens(tok, 400_000)
    kl = distill(target, distilled, tokens, DistillConfig(steps=steps), run_dir=distill_run, tokenizer=tok)
    drafts["first 2 layers, distilled"] = distilled.eval()
    print(f"distilled {steps} steps: KL {kl[0]:.3f} -> {statistics.mean(kl[-10:]):.3f}", flush=True)

    ks = (1, 3) if args.quick else (1, 3, 5)
    batches = (1, 8)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    prompts = held_out_prompts(tok, max(batches))
    ecfg = dict(max_context=4096, prefix_cache=False)
    runs, rows = [], []
    with torch.inference_mode(), Engine(target, tok, EngineConfig(**ecfg)) as plain:
        plain.generate(prompts[0][:8], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
        for name, draft in drafts.items():
            for k in ks:
                spec = Engine(target, tok, EngineConfig(**ecfg, num_speculative_tokens=k), draft=draft)
                with spec:
                    spec.generate(prompts[0][:8], SamplingParams(max_tokens=4, temperature=0.0))
                    for batch in batches:
                        pairs = []
                        for _ in range(args.rounds):
                            t_plain, ref = timed(plain, prompts[:batch], params)
                            t_spec, out = timed(spec, prompts[:batch], params, counters=True)
                            assert out[0] == ref[0], (
                                f"{name} k={k}: greedy output differs from plain decoding"
                            )
                            pairs.append((t_plain, t_spec, out[1]))
                        entry = summarize(name, k, batch, "none", pairs, args.tokens)
                        runs.append(entry)
                        rows.append(row(entry))
                        print(rows[-1], flush=True)
        best = max((r for r in runs if r["batch"] == 1), key=lambda r: r["speedup_median"])
        comp = composition_rows(target, tok, drafts[best["draft"]], best, prompts, args, plain)
        runs += comp
        rows += [row(e) for e in comp]
    header = ["draft", "k", "batch", "reuse", "acceptance", "tokens / row-step", "speed-up (median)",
              "range over rounds", "speculation"]  # fmt: skip
    table = markdown_table(header, rows)
    table += (
        f"\n\nCPU, fp32, {torch.get_num_threads()} thread(s), shared machine. Target: `{args.model}` "
        f"({target.cfg.n_layers} layers, trained); drafts of {DRAFT_LAYERS} layers. Greedy, "
        f"{args.tokens} tokens per request after a {PROMPT_LEN}-token held-out prompt; speed-up = plain "
        f"time / speculative time per round, median and range of {args.rounds} alternating rounds; every "
        "speculative output equals plain decoding token for token. Acceptance: the share of drafted "
        "tokens the target kept over the cell's rounds; tokens / step: per row and decode step (1 without "
        "speculation). Reuse: `prefix hit` = the prompt's first half was served before (prefix cache on in "
        "both arms), `session turn 2` = a session's second turn on its kept row (both arms), for the "
        "batch-1 draft and k with the best speed-up."
    )
    results = {
        "target": str(args.model),
        "draft_layers": DRAFT_LAYERS,
        "distill": {"steps": steps, "kl_first": kl[0], "kl_last10": statistics.mean(kl[-10:])},
        "tokens": args.tokens,
        "rounds": args.rounds,
        "runs": runs,
        "wall_s": time.perf_counter() - t_start,
    }
    write_results("spec_quick" if args.quick else "spec", results, table, update_readme=not args.quick)
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
