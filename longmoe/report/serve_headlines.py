"""Headlines of the serving benchmarks run in alternating rounds: ``bench/serve.py`` (serve.json,
serve_prefix.json), ``bench/rollout.py`` and ``bench/load.py``. Split from ``headlines.py``.

A file written with rounds gives each headline's noise as the per-round ratio's [min, max] with the
number of rounds (``noise_kind="range"``); a file from before (one sample per number) keeps saying so.
"""

from __future__ import annotations

from longmoe.report import measured
from longmoe.report.rules import ONE_SAMPLE, Headline, round_range, x_ratio


def serve(d: dict) -> list[Headline]:
    lo, hi = min(r["context"] for r in d["decode"]), max(r["context"] for r in d["decode"])
    ratio = d["decode_ratio_last_first"]
    pr = d["prefix_reuse"]
    model = measured.tiny_engine_model(d, "bench/serve.py")
    rng = d.get("decode_ratio_range") or {}
    hybrid_noise = round_range(
        d,
        rng.get("hybrid"),
        "hybrid per-round ratios",
        f"{ONE_SAMPLE}; each context's ms/token the best of 4 rounds (ours) or 3 windows (peer)",
    )
    if rng:
        hybrid_noise["noise"] += (
            f"; pure MLA [{rng['pure_mla']['min']:.2f}, {rng['pure_mla']['max']:.2f}], "
            f"transformers [{rng['peer']['min']:.2f}, {rng['peer']['max']:.2f}]"
        )
    off, on = pr["off"]["ttft_s"], pr["on"]["ttft_s"]
    speedup = pr["ttft_speedup"]["median"] if "ttft_speedup" in pr else off / on
    return [
        Headline(
            f"decode cost growth, context {lo:,} → {hi:,} (ms/token ratio)",
            f"{ratio['hybrid']:.2f}× (hybrid)",
            f"pure MLA {ratio['pure_mla']:.2f}×, transformers KimiLinear {ratio['peer']:.2f}×",
            **hybrid_noise,
            model=model,
        ),
        Headline(
            "time to first token, 4096-token shared prefix (s)",
            f"{on:.3f}",
            f"no prefix reuse {off:.2f} ({x_ratio(speedup)})",
            **round_range(d, pr.get("ttft_speedup"), "per-round speed-ups", ONE_SAMPLE),
            model=model,
        ),
        Headline(
            "throughput, 32 concurrent / 1 request",
            x_ratio(d["throughput_ratio_32_vs_1"]),
            "target ≥ 8×",
            **round_range(d, d.get("throughput_ratio_range"), "per-round ratios", ONE_SAMPLE),
            model=model,
        ),
    ]


def serve_prefix(d: dict) -> list[Headline]:
    on, off = d["turns"]["on"], d["turns"]["off"]
    model = measured.tiny_engine_model(d, "bench/serve.py")
    off_ratio = (
        d["off_last_over_first_range"]["median"] if "off_last_over_first_range" in d else off[-1] / off[0]
    )
    return [
        Headline(
            f"chat turn {len(on)} / turn 1 time to first token, prefix reuse on",
            x_ratio(d["last_over_first"]),
            f"no reuse {x_ratio(off_ratio)}; target ≤ 1.5×",
            **round_range(
                d,
                d.get("last_over_first_range"),
                "per-round ratios",
                "one sample per arm (no rounds recorded)",
            ),
            model=model,
        ),
        Headline(
            "prefix hit within one 16-token chunk of the shared prefix at every offset 0..64",
            "yes" if d.get("hit_within_one_chunk_at_every_offset") else "no",
            "block-aligned hits before (64-token blocks)",
            "deterministic (token counts, no timing)",
            model=model,
            noise_kind="exact",
        ),
    ]


def rollout(d: dict) -> list[Headline]:
    # every episode count, the ones where sessions lose included
    ns = sorted({r["episodes"] for r in d["rows"] if r["mode"] == "session"})
    sp = {n: next(r for r in d["rows"] if r["episodes"] == n and r["mode"] == "session") for n in ns}
    losing = [n for n in ns if sp[n]["speedup_vs_reprefill"] < 1]
    if all("speedup_range" in sp[n] for n in ns):
        cells = ", ".join(
            f"{n}: {x_ratio(s['median'])} [{s['min']:.2f}, {s['max']:.2f}]"
            for n, s in ((n, sp[n]["speedup_range"]) for n in ns)
        )
        noise = {
            "noise": f"per-round speed-ups [min, max] per episode count, shown in the value "
            f"({d['n_rounds']} alternating rounds)",
            "noise_kind": "range",
        }
    else:
        cells = ", ".join(f"{n}: {x_ratio(sp[n]['speedup_vs_reprefill'])}" for n in ns)
        noise = {"noise": f"{ONE_SAMPLE} per episode count"}
    return [
        Headline(
            "multi-turn rollouts: engine sessions / re-prefill every turn, trajectory tok/s, by episodes",
            cells,
            "re-prefill every turn 1.00×; sessions slower at "
            + (", ".join(str(n) for n in losing) + " episodes" if losing else "no count"),
            **noise,
            model=measured.tiny_engine_model(d, "bench/rollout.py"),
        )
    ]


def load(d: dict) -> list[Headline]:
    checks = f"{len(d['errors'])} errors, {len(d['mismatches'])} mismatched outputs"
    s = d.get("speedup_range")
    noise = round_range(d, s, "per-round speed-ups", f"{ONE_SAMPLE}; {checks}")
    if s:
        noise["noise"] += f"; {checks} over all rounds"
    return [
        Headline(
            f"{d['clients']} concurrent HTTP clients, wall time (s)",
            f"{d['wall_s']:.2f}",
            f"one at a time {d['solo_sequential_s']:.1f} ({x_ratio(d['speedup_vs_sequential'])})",
            **noise,
            model=measured.load_model(d),
        )
    ]
