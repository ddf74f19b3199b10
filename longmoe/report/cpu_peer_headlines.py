"""Headlines of the CPU side-by-side with llama.cpp (``bench/cpu_serve.py``): longmoe against the peer's
main rows, as its users run it, each value median [min, max] over alternating rounds, losing rows kept.
Split from ``headlines.py``: the one section whose numbers are ratios against an external engine."""

from __future__ import annotations

import statistics

from longmoe.report.rules import Headline


def _faster(ours: float, peer: float, peer_name: str, lower_is_better: bool = True) -> str:
    """Who is faster and by how much, from two measurements of the same quantity (two decimals under
    1.1×, where one would print a 3% gap as "1.0× faster")."""
    r = ours / peer if lower_is_better else peer / ours  # > 1: the peer is faster
    who, x = (peer_name, r) if r > 1 else ("longmoe", 1 / r)
    return f"{who} {x:.2f}× faster" if x < 1.1 else f"{who} {x:.1f}× faster"


def _med_range(xs: list[float], scale: float = 1.0, invert: bool = False) -> tuple[float, float, float]:
    """(median, min, max) of ``xs`` x ``scale``, or of ``scale / x`` when ``invert`` (seconds -> tok/s)."""
    ys = sorted(scale / x for x in xs) if invert else sorted(x * scale for x in xs)
    return statistics.median(ys), ys[0], ys[-1]


def _rng(m: float, lo: float, hi: float, f: str = ".1f") -> str:
    return f"{m:{f}} [{lo:{f}}, {hi:{f}}]"


def cpu_serve(d: dict) -> list[Headline]:
    """Against llama.cpp's main rows (its users' setting: flash attention on, KV f16); both precisions and
    the first and last decode context, losing rows included; every value is median [min, max] over rounds."""
    threads = max(d["runs"], key=int)
    m, commit = d["runs"][threads]["measured"], d["runs"][threads].get("commit") or ""
    model = (d.get("model") or {}).get("label", "~0.3B") + " Kimi-Linear, random weights"
    settings = d.get("peer_settings") or {}
    peer_set = settings.get("llama.cpp f32", "flash attention off, KV f16 (setting not recorded)")
    out = []
    for ctx in sorted({min(m["decode"], key=int), max(m["decode"], key=int)}, key=int):
        row = m["decode"][ctx]
        n = min(len(row[a]) for a in ("longmoe fp32 --compile", "llama.cpp f32"))
        for ours, peer in (
            ("longmoe fp32 --compile", "llama.cpp f32"),
            ("longmoe int8 --compile", "llama.cpp q8_0"),
        ):
            o, p = _med_range(row[ours]), _med_range(row[peer])
            out.append(
                Headline(
                    f"CPU batch-1 decode, {ours.removeprefix('longmoe ')} vs {peer}, context {int(ctx):,} "
                    "(ms/token)",
                    _rng(*o),
                    f"{peer} {_rng(*p)}, {peer_set} ({_faster(o[0], p[0], 'llama.cpp')})",
                    f"median [min, max] over {n} alternating rounds, {threads} thread(s), shared machine",
                    readme=True,
                    model=model,
                    noise_kind="range",
                    commit=commit,
                )
            )
    n = max(m["prefill"], key=int)
    row = m["prefill"][n]
    for ours, peer in (
        ("longmoe fp32 --compile", "llama.cpp f32"),
        ("longmoe int8 --compile", "llama.cpp q8_0"),
    ):
        if ours not in row:  # written before the per-arm contexts: the eager rows
            ours = ours.removesuffix(" --compile")
        o, p = _med_range(row[ours], int(n), True), _med_range(row[peer], int(n), True)
        k = min(len(row[ours]), len(row[peer]))
        out.append(
            Headline(
                f"CPU prefill, {ours.removeprefix('longmoe ')} vs {peer}, {int(n):,}-token prompt (tok/s)",
                _rng(*o, f=".0f"),
                f"{peer} {_rng(*p, f='.0f')}, {peer_set} "
                f"({_faster(o[0], p[0], 'llama.cpp', lower_is_better=False)})",
                f"median [min, max] over {k} round(s), {threads} thread(s), shared machine",
                readme=k >= 3,  # a single sample carries no headline
                model=model,
                noise_kind="range" if k >= 3 else "",
                commit=commit,
            )
        )
    return out
