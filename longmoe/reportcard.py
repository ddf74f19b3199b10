"""`longmoe report`: one report card from every committed result JSON (benchmarks, recipes, the demo).

Each result file is one section: its headline numbers beside the baseline they are read against and the
noise the run recorded, then where the numbers came from (commit, date, machine, threads, command, wall
time). A file that does not record one of those says "not recorded" instead of guessing. The README's
headline table is rendered here too, so no number in it is typed by hand (``python -m bench.tables``
writes it between markers; a test fails when it is stale).

Reads JSON only: no torch, no model, no stage (an import-linter contract keeps it so).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longmoe.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIRS = ("bench/results", "docs/results")  # relative to the repository root
NOT_RECORDED = "not recorded"
PROVENANCE_FIELDS = ("commit", "date", "machine", "threads", "command", "wall_s")


class ReportError(UserError):
    """A result file that cannot be read (malformed JSON, not an object) or a missing results folder."""


@dataclass(frozen=True)
class Result:
    """One result file: its section name (the file stem, ``_results`` dropped) and parsed content."""

    name: str
    path: Path
    data: dict[str, Any]

    @property
    def smoke(self) -> bool:
        """A ``--quick`` run: checks the script works; its numbers are not results."""
        return self.name.endswith("_quick")


@dataclass(frozen=True)
class Headline:
    """One number worth reading, with what it is read against and how noisy it is."""

    label: str
    value: str
    baseline: str
    noise: str
    readme: bool = False  # also in the README's headline table


def collect(dirs: Iterable[Path]) -> list[Result]:
    """Every ``*.json`` in ``dirs`` (not recursive), sorted by section name within each folder."""
    out: list[Result] = []
    for d in dirs:
        if not d.is_dir():
            raise ReportError(f"{d}: no such results folder")
        for p in sorted(d.glob("*.json")):
            try:
                data = json.loads(p.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ReportError(f"{p}: not valid JSON ({e})") from None
            if not isinstance(data, dict):
                raise ReportError(f"{p}: expected a JSON object at the top, found {type(data).__name__}")
            out.append(Result(p.stem.removesuffix("_results"), p, data))
    return out


def default_dirs(root: Path = ROOT) -> list[Path]:
    return [root / d for d in DEFAULT_DIRS]


def provenance(data: dict[str, Any]) -> dict[str, str]:
    """Commit, date, machine, threads, command and wall time of a result, each "not recorded" if absent.

    New files carry a ``provenance`` object (``bench.common.provenance``); older benchmark files only a
    ``machine`` object (torch version, threads, CPU architecture), read as far as it goes.
    """
    p = data.get("provenance") or {}
    m = data.get("machine") or {}
    machine = p.get("machine") or " ".join(str(m[k]) for k in ("cpu", "gpu") if m.get(k)) or None
    if machine and m.get("torch") and "torch" not in machine:
        machine = f"{machine}, torch {m['torch']}"
    raw = {
        "commit": p.get("commit"),
        "date": p.get("date"),
        "machine": machine,
        "threads": p.get("threads", m.get("threads")),
        "command": p.get("command"),
        "wall_s": p.get("wall_s"),
    }
    out = {}
    for k, v in raw.items():
        if v is None or v == "":
            out[k] = NOT_RECORDED
        elif k == "wall_s":
            out[k] = f"{float(v):,.0f} s"
        else:
            out[k] = str(v)
    return out


# ---- headline numbers, one function per section; a KeyError means the file's layout changed ----------


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


def _kda(d: dict) -> list[Headline]:
    rs = d["results"]
    big = max((r for r in rs if r["dtype"] == "float32"), key=lambda r: r["T"])
    peer = "transformers chunk64"
    gate = "longmoe log-space (unbounded gate)"
    sp = [r["speedup_fwd"][gate] for r in rs if gate in r["speedup_fwd"]]
    return [
        Headline(
            f"KDA operator forward, T = {big['T']:,} fp32 (ms)",
            _n(big["fwd_s"]["longmoe"] * 1e3),
            f"{peer} {_n(big['fwd_s'][peer] * 1e3)} ({_x(big['speedup_fwd'][peer])} faster)",
            _SPREAD,
            readme=True,
        ),
        Headline(
            f"bounded-decay all-GEMM chunk vs exact log-space path, forward, T = {min(r['T'] for r in rs):,}"
            f"-{max(r['T'] for r in rs):,}",
            f"{min(sp):.1f}-{max(sp):.1f}× faster",
            "log-space path an unbounded gate needs (same run)",
            _SPREAD,
            readme=True,
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
    c = d["compiled"]
    rounds = sorted(r["eager_ms"] / r["compiled_ms"] for r in c["rounds"])
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
            f"compiled engine decode, batch 1, context {c['context']:,} (ms/token)",
            _n(c["compiled_ms"]),
            f"eager {_n(c['eager_ms'])} ({_x(c['speedup'])})",
            f"per-round speed-ups {', '.join(f'{s:.2f}' for s in rounds)}",
            readme=True,
        ),
        Headline(
            "time to first token, 4096-token shared prefix (s)",
            f"{pr['on']['ttft_s']:.3f}",
            f"no prefix reuse {pr['off']['ttft_s']:.2f} ({_x(pr['off']['ttft_s'] / pr['on']['ttft_s'])})",
            _SPREAD,
            readme=True,
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
            readme=True,
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
            readme=True,
        )
    ]


def _quant(d: dict) -> list[Headline]:
    v = d["variants"]
    f, q8, q4 = v["fp32"], v["int8"], v["int4"]
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
        for name, x in (("int8", q8), ("int4", q4))
    ]


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


def _vision_extract(d: dict) -> list[Headline]:
    m, c = d["main_eval"]["form_easy"], d["control_eval"]["form_easy"]
    return [
        Headline(
            "image → JSON field F1, easy forms",
            f"{m['f1']:.3f} ± {m['f1_se']:.3f}",
            f"text-only control {c['f1']:.3f} ± {c['f1_se']:.3f}; target {d['target_f1']}",
            f"± one standard error over {m['n']} forms",
        )
    ]


HEADLINES: dict[str, Callable[[dict], list[Headline]]] = {
    "demo": _demo,
    "kda": _kda,
    "model": _model,
    "serve": _serve,
    "moe": _moe,
    "packed_attention": _packed_attention,
    "quant": _quant,
    "rollout": _rollout,
    "load": _load,
    "ablations": _checks("design ablations"),
    "mqar": _checks("associative recall sweep"),
    "vision_extract": _vision_extract,
}


def ordered(results: list[Result]) -> list[Result]:
    """Sections in ``HEADLINES`` order (the demo first), then the rest as collected."""
    rank = {k: i for i, k in enumerate(HEADLINES)}
    return sorted(results, key=lambda r: rank.get(r.name, len(rank)))


def headlines(r: Result) -> list[Headline]:
    fn = HEADLINES.get(r.name)
    if fn is None or r.smoke:
        return []
    try:
        return fn(r.data)
    except (KeyError, TypeError, ValueError, StopIteration, ZeroDivisionError) as e:
        raise ReportError(f"{r.path}: headline numbers not found ({type(e).__name__}: {e})") from None


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(p)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def headline_table(results: list[Result], root: Path = ROOT) -> str:
    """The README's short table: the headline numbers marked ``readme``, each with its source file."""
    lines = [_row(["result", "longmoe", "baseline (same run)", "source"]), "|---|---|---|---|"]
    for r in ordered(results):
        for h in headlines(r):
            if h.readme:
                lines.append(_row([h.label, h.value, h.baseline, f"`{_rel(r.path, root)}`"]))
    return "\n".join(lines)


def render(results: list[Result], root: Path = ROOT) -> str:
    """The whole report card (deterministic: same files, same text, so ``--check`` can compare)."""
    full = [r for r in ordered(results) if not r.smoke]
    smoke = [r for r in results if r.smoke]
    lines = [
        "# longmoe report card",
        "",
        "Written by `longmoe report` from the committed result files; do not edit by hand. Each section is "
        "one file: its headline numbers against their baseline, the noise it recorded, and its provenance "
        f'("{NOT_RECORDED}" where the file does not say). Tables: [benchmarks.md](benchmarks.md).',
        "",
    ]
    for r in full:
        lines += [f"## {r.name}", "", f"Source: `{_rel(r.path, root)}`", ""]
        hs = headlines(r)
        if hs:
            lines += [_row(["measure", "value", "baseline", "noise"]), "|---|---|---|---|"]
            lines += [_row([h.label, h.value, h.baseline, h.noise]) for h in hs]
        else:
            lines.append("No headline numbers defined for this file (`longmoe/reportcard.py` HEADLINES).")
        p = provenance(r.data)
        lines += ["", "Provenance: " + "; ".join(f"{k} {p[k]}" for k in PROVENANCE_FIELDS), ""]
    if smoke:
        lines += ["## Smoke runs (`--quick`: the scripts work; not results)", ""]
        lines += [_row(["file", "commit", "date", "machine"]), "|---|---|---|---|"]
        for r in smoke:
            p = provenance(r.data)
            lines.append(_row([f"`{_rel(r.path, root)}`", p["commit"], p["date"], p["machine"]]))
        lines.append("")
    return "\n".join(lines)


# ---- the `longmoe report` command -----------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--results", type=Path, action="append", metavar="DIR",
        help=f"a folder of result JSON files (repeatable; default: {', '.join(DEFAULT_DIRS)})",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("report.md"), help="where to write (report.md)")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if --out differs from what would be written",
    )


def run(args: argparse.Namespace) -> int:
    text = render(collect(args.results or default_dirs()))
    if args.check:
        current = args.out.read_text() if args.out.exists() else None
        if current != text:
            print(f"{args.out} is stale: run `longmoe report --out {args.out}`")
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0
