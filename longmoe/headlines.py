"""The headline numbers of each result file, by section (the file's stem): what ``longmoe report`` and
the README's headline table print, each beside the baseline it is read against and the noise the run
recorded. One function per section reads that section's JSON layout; ``readme=True`` marks the few
numbers the README shows.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Headline:
    """One number worth reading, with what it is read against and how noisy it is."""

    label: str
    value: str
    baseline: str
    noise: str
    readme: bool = False  # also in the README's headline table


def _x(a: float) -> str:
    return f"{a:.2f}×" if a < 10 else f"{a:.1f}×"


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


_SPREAD = "spread not recorded (shared machine)"


def _demo(d: dict) -> list[Headline]:
    out = []
    longest = max((e for e in d["eval"] if not e["beyond_training"]), key=lambda e: e["length"])
    ratio = longest["val_loss"] / longest["unigram_loss"]
    out.append(
        Headline(
            f"demo LM validation loss at its {longest['length']:,}-token window (nats/token)",
            f"{longest['val_loss']:.3f}",
            f"unigram model {longest['unigram_loss']:.3f} ({ratio:.2f}×)",
            "one run, seed 0",
            readme=True,
        )
    )
    rc = d.get("recall")
    if rc:
        n, a = max(rc["accuracy"].items(), key=lambda kv: int(kv[0]))
        se = math.sqrt(a * (1 - a) / rc["answers"])
        k = int(n) // rc["train_len"]
        out.append(
            Headline(
                f"demo recall accuracy at {k}× its training length (MQAR, {int(n):,} tokens)",
                f"{a:.3f} ± {se:.3f}",
                f"chance {rc['chance']:.3f}",
                f"± one standard error over {rc['answers']} answers",
                readme=True,
            )
        )
    return out


_UNBOUNDED = (  # bench/kda.py's names for the exact unbounded-gate paths, strongest first
    ("longmoe sub-chunk (unbounded gate)", "sub-chunk"),
    ("longmoe log-space (unbounded gate)", "log-space"),
)


def _kda(d: dict) -> list[Headline]:
    rs = d["results"]
    big = max((r for r in rs if r["dtype"] == "float32"), key=lambda r: r["T"])
    peer = "transformers chunk64"
    # the strongest unbounded path the run measured: sub-chunk GEMMs where present, else pairwise log space
    gate, what = next(
        ((g, w) for g, w in _UNBOUNDED if any(g in r["speedup_fwd"] for r in rs)), _UNBOUNDED[-1]
    )
    sp = [r["speedup_fwd"][gate] for r in rs if gate in r["speedup_fwd"]] or [float("nan")]
    return [
        Headline(
            f"KDA operator forward, T = {big['T']:,} fp32 (ms)",
            _n(big["fwd_s"]["longmoe"] * 1e3),
            f"{peer} {_n(big['fwd_s'][peer] * 1e3)} ({_x(big['speedup_fwd'][peer])} faster)",
            _SPREAD,
            readme=True,
        ),
        Headline(
            f"bounded-decay all-GEMM chunk vs exact {what} path, forward, T = {min(r['T'] for r in rs):,}"
            f"-{max(r['T'] for r in rs):,}",
            f"{min(sp):.1f}-{max(sp):.1f}× faster",
            f"{what} path an unbounded gate needs (same run)",
            _SPREAD,
            readme=False,
        ),
    ]


def _model(d: dict) -> list[Headline]:
    t = max(d["train"], key=lambda r: r["T"])
    dec = max(d["decode"], key=lambda r: r["context"])
    return [
        Headline(
            f"whole-model training fwd+bwd, T = {t['T']:,} (tok/s)",
            _n(t["ours_tok_s"]),
            f"transformers KimiLinear {_n(t['peer_tok_s'])} ({_x(t['ours_tok_s'] / t['peer_tok_s'])})",
            _SPREAD,
            readme=True,
        ),
        Headline(
            f"decode at context {dec['context']:,} (ms/token)",
            _n(dec["ours_ms"]),
            f"transformers KimiLinear {_n(dec['peer_ms'])} ({_x(dec['peer_ms'] / dec['ours_ms'])})",
            _SPREAD,
        ),
    ]


def _serve(d: dict) -> list[Headline]:
    lo, hi = min(r["context"] for r in d["decode"]), max(r["context"] for r in d["decode"])
    ratio = d["decode_ratio_last_first"]
    pr = d["prefix_reuse"]
    return [
        Headline(
            f"decode cost growth, context {lo:,} → {hi:,} (ms/token ratio)",
            f"{ratio['hybrid']:.2f}× (hybrid)",
            f"pure MLA {ratio['pure_mla']:.2f}×, transformers KimiLinear {ratio['peer']:.2f}×",
            _SPREAD,
            readme=True,
        ),
        Headline(
            "time to first token, 4096-token shared prefix (s)",
            f"{pr['on']['ttft_s']:.3f}",
            f"no prefix reuse {pr['off']['ttft_s']:.2f} ({_x(pr['off']['ttft_s'] / pr['on']['ttft_s'])})",
            _SPREAD,
            readme=False,
        ),
        Headline(
            "throughput, 32 concurrent / 1 request",
            _x(d["throughput_ratio_32_vs_1"]),
            "target ≥ 8×",
            _SPREAD,
        ),
    ]


def _moe(d: dict) -> list[Headline]:
    rows = [r for r in d["rows"] if r["dtype"] == "float32" and r["α"] == 1]
    e = max(r["E"] for r in rows)
    ours = next(r for r in rows if r["E"] == e and r["impl"] == "longmoe")
    peer = next(r for r in rows if r["E"] == e and r["impl"] == "transformers grouped_mm")
    return [
        Headline(
            f"MoE layer fwd+bwd, E = {e}, 4096 tokens, fp32 (s)",
            f"{ours['fwd+bwd s']:.3f} ({ours['fwd+bwd/roof']:.0%} of torch.mm peak)",
            f"transformers grouped_mm {peer['fwd+bwd s']:.3f} ({_x(peer['fwd+bwd s'] / ours['fwd+bwd s'])})",
            _SPREAD,
            readme=False,
        )
    ]


def _packed_attention(d: dict) -> list[Headline]:
    t = max(r["T"] for r in d["rows"])
    ours = next(r for r in d["rows"] if r["T"] == t and r["impl"] == "longmoe")
    full = next(r for r in d["rows"] if r["T"] == t and r["impl"] == "full mask")
    return [
        Headline(
            f"packed causal attention fwd+bwd, T = {t:,}, {ours['n_docs']} documents (s)",
            f"{ours['fwdbwd_s']:.3f}",
            f"full mask {full['fwdbwd_s']:.2f} ({_x(full['fwdbwd_s'] / ours['fwdbwd_s'])})",
            _SPREAD,
            readme=False,
        )
    ]


def _quant(d: dict) -> list[Headline]:
    v = d["variants"]
    f, q4 = v["fp32"], v["int4"]
    mib = 2**20
    if "kl_from_fp32" not in q4:  # written before the KL columns (a barely trained model)
        return [
            Headline(
                "int4 weights: size (MiB) and validation loss at 4K",
                f"{q4['weight_bytes']['total'] / mib:.2f} MiB, loss {q4['val_loss']['4096']:.3f}",
                f"fp32 {f['weight_bytes']['total'] / mib:.2f} MiB, loss {f['val_loss']['4096']:.3f}",
                "one trained model, 4 held-out documents",
                readme=True,
            )
        ]
    uni = d["unigram"]["val_loss"]["4096"]
    return [
        Headline(
            f"{name} weights: KL from fp32 (nats/token), argmax agreement, size",
            f"KL {x['kl_from_fp32']:.1e}, top-1 {x['top1_agreement_with_fp32']:.1%}, "
            f"{x['weight_bytes']['total'] / mib:.2f} MiB",
            f"fp32 {f['weight_bytes']['total'] / mib:.2f} MiB; loss at 4K {f['val_loss']['4096']:.3f} "
            f"(unigram {uni:.3f})",
            "one trained model, 4 held-out documents x 4K positions",
            readme=True,
        )
        for name, x in (("int8", v["int8"]), ("int4", q4))
    ]


def _serve_compile(d: dict) -> list[Headline]:
    c = d["compiled"]
    rounds = [r["eager_ms"] / r["compiled_ms"] for r in c["rounds"]]
    out = [
        Headline(
            f"compiled engine decode, batch 1, context {c['context']:,} (ms/token)",
            _n(c["compiled_ms"]),
            f"eager {_n(c['eager_ms'])}; median per-round speed-up {_x(statistics.median(rounds))}",
            f"per-round speed-ups {min(rounds):.2f}-{max(rounds):.2f} ({len(rounds)} alternating rounds)",
            readme=True,
        )
    ]
    ft = c.get("first_token") or {}
    if ft.get("cold") and ft.get("warm"):
        cold = [r["first_decoded_token_s"] for r in ft["cold"]]
        warm = [r["first_decoded_token_s"] for r in ft["warm"]]
        out.append(
            Headline(
                "`--compile` start-up: first decoded token, fresh process (s)",
                f"cold {min(cold):.0f}-{max(cold):.0f}, warm cache {min(warm):.1f}-{max(warm):.1f}",
                "target cold <= 60, warm <= 10 (before: ~570 cold)",
                f"{len(cold)} cold / {len(warm)} warm processes",
                readme=True,
            )
        )
    return out


def _spec(d: dict) -> list[Headline]:
    plain = [r for r in d["runs"] if r["case"] == "none"]
    best = max(plain, key=lambda r: min(r["speedup_rounds"]))  # the surest win, not the luckiest round
    worst = min(plain, key=lambda r: r["speedup_median"])

    def cell(r: dict) -> str:
        return f"{r['draft']}, k={r['k']}, batch {r['batch']}"

    rng = f"{min(best['speedup_rounds']):.2f}-{max(best['speedup_rounds']):.2f}"
    return [
        Headline(
            "speculative decoding on a trained target: surest win (median speed-up, acceptance)",
            f"{_x(best['speedup_median'])}, acceptance {best['acceptance']:.2f} ({cell(best)})",
            f"no speculation 1.00×; worst cell {_x(worst['speedup_median'])} ({cell(worst)})",
            f"per-round speed-ups {rng} ({d['rounds']} alternating rounds)",
            readme=True,
        )
    ]


def _serve_prefix(d: dict) -> list[Headline]:
    on, off = d["turns"]["on"], d["turns"]["off"]
    return [
        Headline(
            f"chat turn {len(on)} / turn 1 time to first token, prefix reuse on",
            _x(on[-1] / on[0]),
            f"no reuse {_x(off[-1] / off[0])}; target ≤ 1.5×",
            "one run per arm",
            readme=True,
        ),
        Headline(
            "prefix hit within one 16-token chunk of the shared prefix at every offset 0..64",
            "yes" if d.get("hit_within_one_chunk_at_every_offset") else "no",
            "block-aligned hits before (64-token blocks)",
            "deterministic",
        ),
    ]


def _faster(ours: float, peer: float, peer_name: str, lower_is_better: bool = True) -> str:
    """Who is faster and by how much, from two measurements of the same quantity (two decimals under
    1.1×, where one would print a 3% gap as "1.0× faster")."""
    r = ours / peer if lower_is_better else peer / ours  # > 1: the peer is faster
    who, x = (peer_name, r) if r > 1 else ("longmoe", 1 / r)
    return f"{who} {x:.2f}× faster" if x < 1.1 else f"{who} {x:.1f}× faster"


def _cpu_serve(d: dict) -> list[Headline]:
    threads = max(d["runs"], key=int)
    m = d["runs"][threads]["measured"]
    n = max(m["prefill"], key=int)
    pre = {a: int(n) / statistics.median(v) for a, v in m["prefill"][n].items()}
    ours, peer = "longmoe fp32 --compile", "llama.cpp f32"
    out = []
    for ctx in sorted({min(m["decode"], key=int), max(m["decode"], key=int)}, key=int):
        dec = {a: statistics.median(v) for a, v in m["decode"][ctx].items()}
        spread = f"medians of {len(m['decode'][ctx][ours])} round-robin rounds, {threads} thread(s)"
        q8 = _faster(dec["longmoe int8 --compile"], dec["llama.cpp q8_0"], "q8_0")
        out.append(
            Headline(
                f"CPU batch-1 decode vs llama.cpp, ~0.3B Kimi-Linear, context {int(ctx):,} (ms/token)",
                f"{dec[ours]:.1f} (fp32, --compile); int8 --compile {dec['longmoe int8 --compile']:.1f}",
                f"llama.cpp f32 {dec[peer]:.1f} ({_faster(dec[ours], dec[peer], 'llama.cpp')}); "
                f"q8_0 {dec['llama.cpp q8_0']:.1f} ({q8})",
                spread,
                readme=True,
            )
        )
    rounds = len(m["prefill"][n]["longmoe fp32"])
    out.append(
        Headline(
            f"CPU prefill vs llama.cpp, {int(n):,}-token prompt (tok/s)",
            f"{pre['longmoe fp32']:.0f} (fp32); int8 {pre['longmoe int8']:.0f}",
            f"llama.cpp f32 {pre[peer]:.0f} ({_faster(pre['longmoe fp32'], pre[peer], 'llama.cpp', False)}); "
            f"q8_0 {pre['llama.cpp q8_0']:.0f}",
            f"medians of {rounds} round-robin rounds, {threads} thread(s)",
            readme=True,
        )
    )
    return out


def _rollout(d: dict) -> list[Headline]:
    n = max(r["episodes"] for r in d["rows"] if r["mode"] == "session" and r["speedup_vs_reprefill"] > 1)
    s = next(r for r in d["rows"] if r["episodes"] == n and r["mode"] == "session")
    base = next(r for r in d["rows"] if r["episodes"] == n and r["mode"] == "re-prefill")
    return [
        Headline(
            f"multi-turn rollouts, {n} episodes, engine sessions (trajectory tok/s)",
            _n(s["tok_s"]),
            f"re-prefill every turn {_n(base['tok_s'])} ({_x(s['speedup_vs_reprefill'])})",
            _SPREAD,
        )
    ]


def _load(d: dict) -> list[Headline]:
    return [
        Headline(
            f"{d['clients']} concurrent HTTP clients, wall time (s)",
            f"{d['wall_s']:.2f}",
            f"one at a time {d['solo_sequential_s']:.1f} ({_x(d['speedup_vs_sequential'])})",
            f"{sum(d['errors'])} errors, {sum(d['mismatches'])} mismatched outputs",
        )
    ]


def _checks(key: str) -> Callable[[dict], list[Headline]]:
    def f(d: dict) -> list[Headline]:
        verdicts = [c["verdict"] for c in d["checks"]]
        ok = sum(v.startswith("confirmed") for v in verdicts)
        return [
            Headline(
                f"{key}: expectations confirmed",
                f"{ok} of {len(verdicts)}",
                "each expectation's own control (docs/evidence.md)",
                "per check: ± one standard error over seeds, in the file",
            )
        ]

    return f


def _f1_ci(c: dict) -> str:
    if "micro_f1_lo" in c:
        return f"{c['micro_f1']:.3f} [{c['micro_f1_lo']:.3f}, {c['micro_f1_hi']:.3f}]"
    return f"{c['f1']:.3f} ± {c['f1_se']:.3f}"


def _vision_extract(d: dict) -> list[Headline]:
    fam = d.get("target_family", "form_easy")
    m, c = d["main_eval"][fam], (d.get("control_eval") or {}).get(fam)
    ctrl = "no text control" if c is None else f"text-only control {_f1_ci(c)}"
    ci = f"95% interval ({m['micro_f1_interval']})" if "micro_f1_lo" in m else "± one standard error"
    return [
        Headline(
            f"image → JSON field F1, {fam}",
            _f1_ci(m),
            f"{ctrl}; target {d['target_f1']}",
            f"{ci} over {m['n']} pages",
        )
    ]


def _agent(d: dict) -> list[Headline]:
    seeds, lr = d.get("rl_seed_success") or {}, d.get("rl_lr") or {}
    sft_rows = d["evals"]["sft"]
    sft = sum(r["success"] * r["episodes"] for r in sft_rows) / sum(r["episodes"] for r in sft_rows)
    pr = d["paired_rl_minus_sft"]
    if pr is None:  # no per-task episodes: the pooled difference, unpaired
        k = len(seeds.get("per_seed") or {})
        value, noise = f"{100 * (seeds['mean'] - sft):+.1f}", [f"unpaired, {k} RL seed(s)"]
    else:
        k = pr["rl_seeds"]
        value = f"{100 * pr['diff']:+.1f} ± {100 * pr['se']:.1f}"
        noise = [f"± one SE paired over {pr['tasks']} test tasks"]
    sd = seeds.get("seed_sd")
    noise.append(f"seed-to-seed SD {100 * sd:.1f} points" if k > 1 and sd is not None else "one RL seed")
    if len(lr.get("validation_success") or {}) > 1:
        noise.append(f"RL lr {lr['lr']:g} chosen on validation task seeds")
    return [
        Headline(
            f"agentic RL ({d['config']['env']} tool use): held-out success, RL − SFT (points)",
            value,
            f"SFT {100 * sft:.1f}%; RL mean of {k} seed(s) {100 * seeds.get('mean', sft):.1f}%",
            "; ".join(noise),
        )
    ]


HEADLINES: dict[str, Callable[[dict], list[Headline]]] = {
    "demo": _demo,
    "kda": _kda,
    "model": _model,
    "serve": _serve,
    "moe": _moe,
    "packed_attention": _packed_attention,
    "serve_compile": _serve_compile,
    "serve_prefix": _serve_prefix,
    "spec": _spec,
    "cpu_serve": _cpu_serve,
    "quant": _quant,
    "rollout": _rollout,
    "load": _load,
    "ablations": _checks("design ablations"),
    "mqar": _checks("associative recall sweep"),
    "vision_extract": _vision_extract,
    "agent": _agent,
}
