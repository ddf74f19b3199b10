"""The headline numbers of each result file, by section (the file's stem): what ``longmoe report`` and
the README's headline table print, each beside the baseline it is read against and the noise the run
recorded. One function per section reads that section's JSON layout; ``readme=True`` marks the few
numbers the README shows.

The headline rules are in ``rules.py``; the CPU side-by-side with llama.cpp is in ``cpu_peer_headlines.py``;
the serving benchmarks run in rounds (serve, serve_prefix, rollout, load) are in ``serve_headlines.py``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from longmoe.report import measured
from longmoe.report.cpu_peer_headlines import cpu_serve
from longmoe.report.rules import ONE_SAMPLE, Headline, round_range, x_ratio
from longmoe.report.serve_headlines import load, rollout, serve, serve_prefix


def _n(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


_ONE_PASS = f"{ONE_SAMPLE}; each time the median of up to 3 repetitions, which the file does not keep"


def _demo(d: dict) -> list[Headline]:
    out = []
    longest = max((e for e in d["eval"] if not e["beyond_training"]), key=lambda e: e["length"])
    ratio = longest["val_loss"] / longest["unigram_loss"]
    out.append(
        Headline(
            f"demo LM validation loss at its {longest['length']:,}-token window (nats/token)",
            f"{longest['val_loss']:.3f}",
            f"unigram model {longest['unigram_loss']:.3f} ({ratio:.2f}×)",
            "one run, seed 0 (no interval: report card only)",
            model=_demo_model(d),
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
                model=f"demo recall hybrid, {rc['params']:,} parameters"
                if rc.get("params")
                else "demo recall hybrid",
                noise_kind="interval",
            )
        )
    return out


def _demo_model(d: dict) -> str:
    n = d.get("params")
    return f"demo tiny hybrid MoE, {n:,} parameters" if n else "demo tiny hybrid MoE (`--preset tiny`)"


_UNBOUNDED = (  # bench/kda.py's names for the exact unbounded-gate paths, strongest first
    ("longmoe sub-chunk (unbounded gate)", "sub-chunk"),
    ("longmoe log-space (unbounded gate)", "log-space"),
)


def _kda(d: dict) -> list[Headline]:
    rs = d["results"]
    big = max((r for r in rs if r["dtype"] == "float32"), key=lambda r: r["T"])
    # the peer at its strongest setting in this run: the faster of its chunk sizes at this row
    peer = min((k for k in big["fwd_s"] if k.startswith("transformers")), key=lambda k: big["fwd_s"][k])
    # the strongest unbounded path the run measured: sub-chunk GEMMs where present, else pairwise log space
    gate, what = next(
        ((g, w) for g, w in _UNBOUNDED if any(g in r["speedup_fwd"] for r in rs)), _UNBOUNDED[-1]
    )
    gated = [r for r in rs if gate in r["speedup_fwd"]]
    sp = [r["speedup_fwd"][gate] for r in gated] or [float("nan")]
    model = measured.kda_model(d)
    if "n_rounds" in d:  # speedup_fwd: the per-round ratio's median; its [min, max] beside it
        ratio = big["speedup_fwd"][peer]
        noise = round_range(d, big["speedup_fwd_range"][peer])
        ranges = [r["speedup_fwd_range"][gate] for r in gated]
        lo, hi = min(s["min"] for s in ranges), max(s["max"] for s in ranges)
        gate_noise = round_range(d, {"min": lo, "max": hi}, spec=".1f", over=" at every T")
    else:
        ratio = big["fwd_s"][peer] / big["fwd_s"]["longmoe"]
        noise = {"noise": ONE_SAMPLE}
        gate_noise = {"noise": f"{ONE_SAMPLE} per T; the value's range is over T, not rounds"}
    return [
        Headline(
            f"KDA operator forward, T = {big['T']:,} fp32 (ms)",
            _n(big["fwd_s"]["longmoe"] * 1e3),
            f"{peer} (its faster chunk size here) {_n(big['fwd_s'][peer] * 1e3)} ({x_ratio(ratio)} faster)",
            **noise,
            model=model,
        ),
        Headline(
            f"bounded-decay all-GEMM chunk vs exact {what} path, forward, T = {min(r['T'] for r in rs):,}"
            f"-{max(r['T'] for r in rs):,}",
            f"{min(sp):.1f}-{max(sp):.1f}× faster",
            f"{what} path an unbounded gate needs (same run)",
            **gate_noise,
            model=model,
        ),
    ]


def _model(d: dict) -> list[Headline]:
    t = max(d["train"], key=lambda r: r["T"])
    dec = max(d["decode"], key=lambda r: r["context"])
    model = f"bench model (d 256, 8 layers), {d['active_params']:,} active parameters, random weights"

    def noise(row: dict) -> dict:
        if "speedup" not in row:  # written before bench.model ran rounds
            return {"noise": ONE_SAMPLE}
        return round_range(d, row["speedup"])

    return [
        Headline(
            f"whole-model training fwd+bwd, T = {t['T']:,} (tok/s)",
            _n(t["ours_tok_s"]),
            f"transformers KimiLinear {_n(t['peer_tok_s'])} ({x_ratio(t['ours_tok_s'] / t['peer_tok_s'])})",
            **noise(t),
            model=model,
        ),
        Headline(
            f"decode at context {dec['context']:,} (ms/token)",
            _n(dec["ours_ms"]),
            f"transformers KimiLinear {_n(dec['peer_ms'])} ({x_ratio(dec['peer_ms'] / dec['ours_ms'])})",
            **noise(dec),
            model=model,
        ),
    ]


MOE_TOKENS = 4096  # bench/moe.py's tokens per call (512 with --quick, a smoke run)


def _moe(d: dict) -> list[Headline]:
    rows = [r for r in d["rows"] if r["dtype"] == "float32" and r["α"] == 1]
    e = max(r["E"] for r in rows)
    ours = next(r for r in rows if r["E"] == e and r["impl"] == "longmoe")
    peer = next(r for r in rows if r["E"] == e and r["impl"] == "transformers grouped_mm")
    if "n_rounds" in d:  # bench/moe.py's ratios: each speed-up's per-round median and [min, max]
        vs = next(r for r in d["ratios"] if (r["E"], r["dtype"], r["α"]) == (e, "float32", 1))
        s = vs["speed-up vs transformers grouped_mm"]["fwd+bwd s"]
        ratio, noise = s["median"], round_range(d, s)
    else:
        ratio = peer["fwd+bwd s"] / ours["fwd+bwd s"]
        noise = {"noise": _ONE_PASS}
    return [
        Headline(
            f"MoE layer fwd+bwd, E = {e}, {MOE_TOKENS} tokens, fp32 (s)",
            f"{ours['fwd+bwd s']:.3f} ({ours['fwd+bwd/roof']:.0%} of torch.mm peak)",
            f"transformers grouped_mm {peer['fwd+bwd s']:.3f} ({x_ratio(ratio)})",
            **noise,
            model=measured.moe_model(e, MOE_TOKENS),
        )
    ]


def _packed_attention(d: dict) -> list[Headline]:
    t = max(r["T"] for r in d["rows"])
    ours = next(r for r in d["rows"] if r["T"] == t and r["impl"] == "longmoe")
    full = next(r for r in d["rows"] if r["T"] == t and r["impl"] == "full mask")
    if "n_rounds" in d:  # bench/packed_attention.py: the per-round speed-up's median and [min, max]
        s = ours["fwdbwd_speedup_vs_full_mask_range"]
        ratio, noise = s["median"], round_range(d, s)
    else:
        ratio = full["fwdbwd_s"] / ours["fwdbwd_s"]
        noise = {"noise": _ONE_PASS}
    return [
        Headline(
            f"packed causal attention fwd+bwd, T = {t:,}, {ours['n_docs']} documents (s)",
            f"{ours['fwdbwd_s']:.3f}",
            f"full mask {full['fwdbwd_s']:.2f} ({x_ratio(ratio)})",
            **noise,
            model=measured.packed_attention_model(ours),
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
                "one trained model, 4 held-out documents (no interval: report card only)",
                model=measured.quant_model(d),
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
            "one trained model, 4 held-out documents x 4K positions (no interval: report card only)",
            model=measured.quant_model(d),
        )
        for name, x in (("int8", v["int8"]), ("int4", q4))
    ]


_COMPILE_MODELS = {  # bench/serve.py --compile-model -> the model's name and size
    "kimi300m": "~0.3B Kimi-Linear shapes, random weights",
    "100m": "111M (small preset cut to 4 layers), random weights",
}
PRE_REGISTERED_COMPILE_MODEL = "kimi300m"  # the README's compile headline: the largest model measured


def _compile_model(d: dict) -> tuple[str, str]:
    name = measured.command_flag(d, "--compile-model") or "tiny"
    cfg = d.get("config") or {}
    toy = f"toy hybrid (d {cfg.get('d_model')}, {cfg.get('n_layers')} layers), random weights"
    return name, _COMPILE_MODELS.get(name, toy)


def _serve_compile(d: dict) -> list[Headline]:
    c = d["compiled"]
    rounds = [r["eager_ms"] / r["compiled_ms"] for r in c["rounds"]]
    name, model = _compile_model(d)
    out = [
        Headline(
            f"compiled engine decode, batch 1, context {c['context']:,}, {model.split(',')[0]} (ms/token)",
            _n(c["compiled_ms"]),
            f"eager {_n(c['eager_ms'])}; median per-round speed-up {x_ratio(statistics.median(rounds))}",
            f"per-round speed-ups [{min(rounds):.2f}, {max(rounds):.2f}] ({len(rounds)} alternating rounds)",
            readme=name == PRE_REGISTERED_COMPILE_MODEL,
            model=model,
            noise_kind="range",
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
                "target cold <= 60, warm <= 10",
                f"[min, max] over {len(cold)} cold / {len(warm)} warm processes",
                readme=name == "tiny",  # the model the start-up target was set on
                model=model,
                noise_kind="range",
            )
        )
    return out


def _spec(d: dict) -> list[Headline]:
    # no cell is picked on the rounds it reports: the median over every cell, with the cells' range
    plain = [r for r in d["runs"] if r["case"] == "none"]
    meds = sorted(r["speedup_median"] for r in plain)
    wins = sum(m > 1 for m in meds)
    model = measured.spec_model(d)
    return [
        Headline(
            f"speculative decoding: median speed-up over all {len(meds)} draft x k x batch cells",
            f"{x_ratio(statistics.median(meds))}",
            f"no speculation 1.00×; {wins} of {len(meds)} cells faster",
            f"cells' median speed-ups [{meds[0]:.2f}, {meds[-1]:.2f}] (each the median of {d['rounds']} "
            "alternating rounds)",
            readme=True,
            model=model,
            noise_kind="range",
        )
    ]


def _checks(key: str, what: str) -> Callable[[dict], list[Headline]]:
    """A study's tally of confirmed expectations; ``what`` names its models, with the parameter range of
    the runs the file stores."""

    def f(d: dict) -> list[Headline]:
        verdicts = [c["verdict"] for c in d["checks"]]
        ok = sum(v.startswith("confirmed") for v in verdicts)
        size = measured.param_range(r.get("params") for r in d.get("runs", []))
        return [
            Headline(
                f"{key}: expectations confirmed",
                f"{ok} of {len(verdicts)}",
                "each expectation's own control (docs/evidence.md)",
                "per check: ± one standard error over seeds, in the file",
                model=f"{what}, {size}",
            )
        ]

    return f


def _mqar_long(d: dict) -> list[Headline]:
    """The hybrids' recall at the longest length with the queries anywhere in the row (the issue's target)."""
    top, train_len = max(d["settings"]["lengths"]), d["training"]["train_len"]
    out = []
    for s in d["summary"]:
        if (s["placement"], s["length"]) == ("uniform", top) and s["variant"] in ("LLLM", "LM"):
            se = s["se"] if s["se"] is not None else s["pooled_se"]
            out.append(Headline(
                f"MQAR recall at {top:,} tokens, queries uniform, {s['variant']} trained at {train_len}",
                f"{s['mean']:.3f} ± {se:.3f}", f"chance {d['chance']:.3f}; target {d['settings']['target']}",
                f"± one standard error over seeds {s['seeds']}",
                model=f"{s['variant']}, d_model {d['settings']['d_model']}, trained from scratch on MQAR, "
                      f"{measured.mqar_params(d, s['variant'])}",
                noise_kind="interval",
            ))  # fmt: skip
    return out


def _f1_ci(c: dict) -> str:
    if "micro_f1_lo" in c:
        return f"{c['micro_f1']:.3f} [{c['micro_f1_lo']:.3f}, {c['micro_f1_hi']:.3f}]"
    return f"{c['f1']:.3f} ± {c['f1_se']:.3f}"


def _vision_extract(d: dict) -> list[Headline]:
    """One line per target family (the documents runs hold each of four against the target)."""
    out = []
    arm = d.get("arm") or (f"seed {d['seed']}" if "seed" in d else "")
    model = measured.vision_model(d)
    for fam in d.get("target_families") or [d.get("target_family", "form_easy")]:
        m, c = d["main_eval"][fam], (d.get("control_eval") or {}).get(fam)
        ctrl = "no text control" if c is None else f"text-only control {_f1_ci(c)}"
        ci = f"95% interval ({m['micro_f1_interval']})" if "micro_f1_lo" in m else "± one standard error"
        out.append(Headline(f"image → JSON field F1, {fam}" + (f", {arm}" if arm else ""), _f1_ci(m),
                            f"{ctrl}; target {d['target_f1']}", f"{ci} over {m['n']} pages",
                            model=model, noise_kind="interval"))  # fmt: skip
    return out


def _agent(d: dict) -> list[Headline]:
    seeds, lr = d.get("rl_seed_success") or {}, d.get("rl_lr") or {}
    sft_rows = d["evals"]["sft"]
    sft = sum(r["success"] * r["episodes"] for r in sft_rows) / sum(r["episodes"] for r in sft_rows)
    pr = d["paired_rl_minus_sft"]
    if pr is None:  # no per-task episodes: the pooled difference, unpaired
        k = len(seeds.get("per_seed") or {})
        value, noise = f"{100 * (seeds['mean'] - sft):+.1f}", [f"unpaired, {k} RL seed(s)"]
        kind = ""
    else:
        k = pr["rl_seeds"]
        value = f"{100 * pr['diff']:+.1f} ± {100 * pr['se']:.1f}"
        noise, kind = [f"± one SE paired over {pr['tasks']} test tasks"], "interval"
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
            model=measured.agent_model(d),
            noise_kind=kind,
        )
    ]


HEADLINES: dict[str, Callable[[dict], list[Headline]]] = {
    "demo": _demo,
    "kda": _kda,
    "model": _model,
    "serve": serve,
    "moe": _moe,
    "packed_attention": _packed_attention,
    "serve_compile": _serve_compile,
    "serve_compile_kimi300m": _serve_compile,
    "serve_compile_100m": _serve_compile,
    "serve_prefix": serve_prefix,
    "spec": _spec,
    "cpu_serve": cpu_serve,
    "cpu_serve_15m": cpu_serve,
    "quant": _quant,
    "rollout": rollout,
    "load": load,
    "ablations": _checks("design ablations", "tiny hybrids trained per arm from scratch"),
    "mqar": _checks(
        "associative recall sweep", "M / L / LM / LLLM at d_model 64, trained from scratch on MQAR"
    ),
    "mqar_long": _mqar_long,
    "vision_extract": _vision_extract,
    "vision_extract_seed1": _vision_extract,
    "vision_extract_documents": _vision_extract,
    "vision_extract_documents_patch4": _vision_extract,
    "vision_extract_documents_seed1": _vision_extract,
    "agent": _agent,
}
