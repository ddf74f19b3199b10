"""Long-context ablation at tiny scale: layer pattern "L" vs "M" vs "LLLM", trained short, tested long.

``python -m longmoe.recipes.longctx_tiny [--tokens N] [--out DIR]`` (settings: ``config.json`` next to
this file). For every pattern it:

1. builds the ``tiny`` preset with that ``layer_pattern`` and the same parameter count as the
   reference pattern (the first dense FFN's width absorbs the difference between a KDA and an MLA
   layer, so the ablation compares mixers, not sizes),
2. trains it with ``longmoe.train.pretrain.Trainer`` for the same token budget on one window of
   ``window`` tokens: standard-library files mixed with synthetic task documents
   (``synthetic_share``), same tokenizer, data order and seed for all patterns,
3. evaluates the task grid (``longmoe.eval``) at 1x, 2x, 4x and 8x the training window and the loss
   by position up to 8x,

then writes ``OUT/report.md``, ``OUT/results.json`` and comparison plots in ``OUT/plots/``.

Synthetic documents are rendered at ``window x U[lo, hi]`` tokens (``synthetic_length``), not at
the full window: the packer lays documents back to back and a document of a full window (plus bos,
answer and eos) would always be cut, its question and answer landing in the next window without the
context they depend on. ``longmoe.data.mix.SyntheticSource`` does this; each curriculum stage carries
its own range (``CurriculumStage.synthetic_length``).

Training is a two-stage curriculum over document length, short before long as in the seeds: the
first ``short_docs_fraction`` of the tokens packs short task documents (``short_docs_length``, e.g.
0.1-0.5 x window, several per window: more questions and answer tokens per window while the model
has to learn to copy), and the rest uses the full range. The window itself never changes, so the
patterns see the same positions.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longmoe.checkpoint import METRICS

CONFIG_FILE = Path(__file__).with_name("config.json")
DONE_FILE = "recipe_done.json"


@dataclass
class RecipeConfig:
    patterns: list[str] = field(default_factory=lambda: ["L", "M", "LLLM"])
    reference_pattern: str = "LLLM"
    preset: str = "tiny"
    window: int = 512
    tokens: int = 6_000_000
    batch_size: int = 8
    synthetic_share: float = 0.8
    synthetic_tasks: list[str] = field(default_factory=lambda: ["niah", "multihop", "conflict", "recall"])
    synthetic_length: list[float] = field(default_factory=lambda: [0.2, 0.9])
    short_docs_fraction: float = 0.5  # share of the tokens in a first stage of short task documents
    short_docs_length: list[float] = field(default_factory=lambda: [0.1, 0.5])
    synthetic_loss: str = "answer"  # task documents train on their answers (see module doc)
    lr: float = 3e-3
    warmup_steps: int = 20
    seed: int = 0
    tokenizer_vocab: int = 2048
    tokenizer_chars: int = 5_000_000
    eval_tasks: list[str] = field(default_factory=lambda: ["niah", "multihop", "conflict", "recall"])
    eval_multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    eval_depths: int = 3
    eval_n: int = 6
    eval_seed: int = 1000
    ppl_docs: int = 2

    def __post_init__(self) -> None:
        bad = [p for p in self.patterns if not p or set(p) - {"L", "M"}]
        if bad or not self.patterns:
            raise ValueError(f"patterns={self.patterns} is invalid: expected strings of 'L' and 'M'")
        if self.window < 128 or self.tokens < self.window:
            raise ValueError(
                f"window={self.window}, tokens={self.tokens}: expected window >= 128, tokens >= window"
            )
        from longmoe.data.mix import SYNTHETIC_LOSS, SYNTHETIC_TASKS, valid_length_range

        if not self.synthetic_tasks or set(self.synthetic_tasks) - set(SYNTHETIC_TASKS):
            raise ValueError(
                f"synthetic_tasks={self.synthetic_tasks} is invalid: "
                f"expected a non-empty list from {SYNTHETIC_TASKS}"
            )
        if not 0.0 <= self.synthetic_share < 1.0:
            raise ValueError(f"synthetic_share={self.synthetic_share} is invalid: expected a float in [0, 1)")
        if self.synthetic_loss not in SYNTHETIC_LOSS:
            raise ValueError(
                f"synthetic_loss={self.synthetic_loss!r} is invalid: expected one of {SYNTHETIC_LOSS}"
            )
        for name in ("synthetic_length", "short_docs_length"):
            rng = getattr(self, name)
            if not (isinstance(rng, list) and valid_length_range(rng)):
                raise ValueError(f"{name}={rng} is invalid: expected [lo, hi] with 0 < lo <= hi < 1")
        if not 0.0 <= self.short_docs_fraction < 1.0:
            raise ValueError(
                f"short_docs_fraction={self.short_docs_fraction} is invalid: expected a float in [0, 1)"
            )

    @classmethod
    def load(cls, path: str | Path = CONFIG_FILE, **overrides: Any) -> RecipeConfig:
        d = json.loads(Path(path).read_text())
        d.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{path}: unknown recipe settings {unknown}; expected some of {sorted(known)}")
        return cls(**d)


# ---------------------------------------------------------------------- models of equal size
def n_params(cfg: Any) -> int:
    from longmoe.model import LongMoE

    return LongMoE(cfg).num_parameters()


def model_config(rc: RecipeConfig, pattern: str, target: int | None = None) -> Any:
    """The preset with ``pattern``; with ``target``, the first dense FFN resized to match it."""
    from longmoe.config import preset

    cfg = preset(rc.preset).replace(layer_pattern=pattern, max_seq_len=rc.window)
    if target is None:
        return cfg
    if cfg.ffn.kind == "moe" and cfg.ffn.first_k_dense < 1:
        raise ValueError("matching parameter counts needs a dense first FFN (ffn.first_k_dense >= 1)")
    n = n_params(cfg)
    per_unit = 3 * cfg.d_model * max(1, cfg.ffn.first_k_dense if cfg.ffn.kind == "moe" else cfg.n_layers)
    guess = cfg.ffn.dense_hidden + round((target - n) / per_unit)
    best = min(
        (max(8, guess + k) for k in range(-3, 4)),
        key=lambda h: abs(n_params(cfg.replace(ffn=dataclasses.replace(cfg.ffn, dense_hidden=h))) - target),
    )
    return cfg.replace(ffn=dataclasses.replace(cfg.ffn, dense_hidden=best))


# ---------------------------------------------------------------------- training
def train_config(rc: RecipeConfig) -> Any:
    from longmoe.data.mix import SYNTHETIC_TASKS
    from longmoe.data.stages import CurriculumStage
    from longmoe.train.config import TrainConfig

    synth = "synthetic"  # every family; a subset is named 'synthetic:<task>+<task>'
    if set(rc.synthetic_tasks) != set(SYNTHETIC_TASKS):
        synth = "synthetic:" + "+".join(rc.synthetic_tasks)
    mix = {"file": 1.0 - rc.synthetic_share, synth: rc.synthetic_share}
    if rc.synthetic_share == 0:
        mix = {"file": 1.0}
    short_tokens = int(rc.tokens * rc.short_docs_fraction)
    if rc.synthetic_share == 0 or short_tokens < rc.batch_size * rc.window:
        short_tokens = 0  # no task documents, or a stage too small to hold one batch
    stage = lambda name, tokens, rng: CurriculumStage(  # noqa: E731
        name,
        window=rc.window,
        tokens=tokens,
        batch_size=rc.batch_size,
        mix=mix,
        synthetic_loss=rc.synthetic_loss,
        synthetic_length=list(rng),
    )
    stages = [stage("short-docs", short_tokens, rc.short_docs_length)] if short_tokens else []
    stages.append(stage("full", rc.tokens - short_tokens, rc.synthetic_length))
    steps = sum(s.steps for s in stages)
    return TrainConfig(
        stages=stages,
        lr=rc.lr,
        warmup_steps=min(rc.warmup_steps, max(1, steps // 10)),
        seed=rc.seed,
        eval_every=0,
        ckpt_every=max(10, min(steps // 4, 200)),  # a killed long run loses at most ~200 steps
        keep_last=1,
    )


def train_one(rc: RecipeConfig, cfg: Any, tok: Any, run_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Train (or resume, or skip when finished) one pattern's run; returns its training summary."""
    from longmoe.train.pretrain import Trainer

    done = run_dir / DONE_FILE
    if done.is_file():
        return json.loads(done.read_text())
    trainer = Trainer(run_dir, cfg, train_config(rc), tok, resume=True, progress=progress)
    summary = trainer.fit()
    summary["params"] = trainer.model.num_parameters()
    summary.update(last_losses(run_dir))
    done.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def last_losses(run_dir: Path) -> dict[str, Any]:
    """Mean train loss over the last 10 logged steps and the last validation loss of a run."""
    f = run_dir / METRICS
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
    train = [r["loss"] for r in rows if "loss" in r][-10:]
    val = [r["val_loss"] for r in rows if "val_loss" in r]
    return {
        "train_loss_last10": sum(train) / len(train) if train else None,
        "val_loss": val[-1] if val else None,
    }


# ---------------------------------------------------------------------- evaluation
def eval_one(rc: RecipeConfig, run_dir: Path, progress: bool = True) -> dict[str, Any]:
    """Task grid at ``eval_multiples`` x window, and loss by position up to the largest multiple."""
    import torch

    from longmoe.eval import runner
    from longmoe.eval.clients import LocalClient
    from longmoe.eval.plots import plot_run
    from longmoe.eval.ppl import ppl_by_position

    out = run_dir / "eval"
    client = LocalClient(run_dir)
    lengths = [m * rc.window for m in rc.eval_multiples]
    depths = runner.parse_depths(rc.eval_depths)
    grid = runner.build_grid(rc.eval_tasks, lengths, depths, rc.eval_n, rc.eval_seed, client.tokenizer)
    runner.run_grid(client, grid, out, client.tokenizer, batch_size=8, progress=progress)
    client.close()
    summary = runner.write_summary(out)
    ppl_file, nll_file = out / "ppl.json", out / "answer_nll.json"
    if not ppl_file.is_file() or not nll_file.is_file():
        model, tok = client.engine.model, client.tokenizer  # the weights the grid was scored with
        with torch.no_grad():
            if not ppl_file.is_file():
                res = ppl_by_position(model, tok, max(lengths), rc.window, rc.ppl_docs, bucket=rc.window // 4)
                ppl_file.write_text(json.dumps(res, indent=2) + "\n")
            if not nll_file.is_file():
                nll_file.write_text(json.dumps(answer_nll_table(model, tok, grid), indent=2) + "\n")
    plot_run(out)
    return {
        "summary": summary,
        "ppl": json.loads(ppl_file.read_text()),
        "answer_nll": json.loads(nll_file.read_text()),
    }


def answer_nll_table(model: Any, tok: Any, grid: list[Any]) -> list[dict[str, Any]]:
    """Mean teacher-forced answer loss per (task, variant, length) over the grid's items."""
    from collections import defaultdict

    from longmoe.eval.ppl import answer_loss

    groups: dict[tuple, list[float]] = defaultdict(list)
    for g in grid:
        nll = answer_loss(model, tok, g.item.prompt(), g.item.answer_text())
        groups[(g.task, g.item.metadata["variant"], g.length)].append(nll)
        groups[(g.task, "*", g.length)].append(nll)
    return [
        {"task": t, "variant": v, "length": n, "n": len(xs), "answer_nll": sum(xs) / len(xs)}
        for (t, v, n), xs in sorted(groups.items())
    ]


# ---------------------------------------------------------------------- comparison
def _acc(summary: dict[str, Any], task: str, length: int, metric: str = "all") -> float:
    for r in summary["by_length"]:
        if r["task"] == task and r["length"] == length:
            return r[metric]
    return math.nan


def _pooled_acc(rows: list[dict[str, Any]]) -> tuple[float, int]:
    """Item-weighted mean accuracy ("all") over summary rows, and the number of items behind it."""
    n = sum(r["n"] for r in rows)
    return (sum(r["all"] * r["n"] for r in rows) / n, n) if n else (math.nan, 0)


def _variant_acc(summary: dict[str, Any], task: str, variant: str, lengths: list[int]) -> tuple[float, int]:
    return _pooled_acc(
        [
            r
            for r in summary["by_variant"]
            if r["task"] == task and r["variant"] == variant and r["length"] in lengths
        ]
    )


def _two_se(a: tuple[float, int], b: tuple[float, int]) -> float:
    """Two standard errors of the difference of two accuracies measured on ``n`` items each."""
    (pa, na), (pb, nb) = a, b
    if not na or not nb:
        return math.nan
    return 2 * math.sqrt(pa * (1 - pa) / na + pb * (1 - pb) / nb)


def _f(x: Any, nd: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def compare(rc: RecipeConfig, out: Path, trained: dict[str, dict], evals: dict[str, dict]) -> str:
    """Markdown report + ``results.json`` + comparison plots for all patterns."""
    from collections import Counter

    from longmoe.eval.plots import accuracy_vs_length, ppl_curve
    from longmoe.eval.runner import RESULTS_FILE, read_results

    W = rc.window
    lengths = [m * W for m in rc.eval_multiples]
    beyond = [n for n in lengths if n > W]
    pats = list(evals)
    lines = [
        f"# longctx_tiny: layer patterns {', '.join(pats)}",
        "",
        f"Preset `{rc.preset}`, trained on {rc.tokens:,} tokens in windows of {W} "
        f"(synthetic share {rc.synthetic_share} of {'+'.join(rc.synthetic_tasks)}, "
        f"synthetic documents {rc.synthetic_length[0]}-"
        f"{rc.synthetic_length[1]} x window"
        + (
            f", after a first {rc.short_docs_fraction:.0%} of the tokens with documents of "
            f"{rc.short_docs_length[0]}-{rc.short_docs_length[1]} x window"
            if rc.short_docs_fraction > 0
            else ""
        )
        + f"), evaluated at {', '.join(str(n) for n in lengths)} tokens, "
        f"{rc.eval_depths} depths, {rc.eval_n} items per cell. Accuracy = all answers contained (RULER).",
        "",
        "| pattern | params | tokens | train loss (last 10) | val loss |",
        "|---|---|---|---|---|",
    ]
    for p in pats:
        t = trained.get(p, {})
        lines.append(
            f"| {p} | {t.get('params', 0):,} | {t.get('tokens', 0):,} | {_f(t.get('train_loss_last10'), 3)} "
            f"| {_f(t.get('val_loss'), 3)} |"
        )
    lines += ["", "Accuracy by task and length (x training window)", ""]
    lines.append("| pattern | task | " + " | ".join(f"{n // W}x ({n})" for n in lengths) + " |")
    lines.append("|---|---|" + "---|" * len(lengths))
    for task in rc.eval_tasks:
        for p in pats:
            s = evals[p]["summary"]
            lines.append(f"| {p} | {task} | " + " | ".join(_f(_acc(s, task, n)) for n in lengths) + " |")
    variants = sorted({(r["task"], r["variant"]) for p in pats for r in evals[p]["summary"]["by_variant"]})
    lines += ["", "Accuracy by variant (all lengths pooled; items per pattern in brackets)", ""]
    lines.append("| variant | " + " | ".join(pats) + " |")
    lines.append("|---|" + "---|" * len(pats))
    for t, v in variants:
        cells = [_variant_acc(evals[p]["summary"], t, v, lengths) for p in pats]
        lines.append(f"| {t}_{v} | " + " | ".join(f"{_f(a)} ({n})" for a, n in cells) + " |")
    lines += [
        "",
        "Answer loss (teacher-forced mean next-token loss of the answer given the prompt; lower = better)",
        "",
    ]
    lines.append("| pattern | task | " + " | ".join(f"{n // W}x ({n})" for n in lengths) + " |")
    lines.append("|---|---|" + "---|" * len(lengths))
    for task in rc.eval_tasks:
        for p in pats:
            nll = {
                r["length"]: r["answer_nll"]
                for r in evals[p].get("answer_nll", [])
                if r["task"] == task and r["variant"] == "*"
            }
            lines.append(f"| {p} | {task} | " + " | ".join(_f(nll.get(n), 3) for n in lengths) + " |")
    lines += ["", "Loss by position (validation files, up to the largest eval length)", ""]
    lines += [
        "| pattern | loss inside window | loss at end of window | loss beyond | beyond / end |",
        "|---|---|---|---|---|",
    ]
    for p in pats:
        r = evals[p]["ppl"]
        lines.append(
            f"| {p} | {_f(r['inside'], 3)} | {_f(r['end_of_window'], 3)} | {_f(r['beyond'], 3)} "
            f"| {_f(r['beyond_over_end'], 3)} |"
        )
    lines += ["", "What the models generate (greedy, first line after `Answer:`)", ""]
    lines += ["| pattern | items | empty answers | most common answer |", "|---|---|---|---|"]
    for p in pats:
        preds = [r["prediction"].strip() for r in read_results(out / f"pattern-{p}" / "eval" / RESULTS_FILE)]
        common = Counter(preds).most_common(1)[0] if preds else ("", 0)
        lines.append(
            f"| {p} | {len(preds)} | {sum(not x for x in preds)} | `{common[0][:40]}` ({common[1]}) |"
        )
    checks = expected_checks(rc, evals, lengths, beyond)
    lines += ["", "Expected outcomes, checked against the numbers above", ""]
    lines += [f"- {c['claim']}: **{c['verdict']}** ({c['evidence']})" for c in checks]
    report = "\n".join(lines) + "\n"

    plots = out / "plots"
    accuracy_vs_length({p: evals[p]["summary"] for p in pats}, plots / "accuracy_vs_length.png", window=W)
    nll_rows = {  # the graded view: answer loss per task and length, where accuracies are all zero
        p: {"by_length": [r for r in evals[p].get("answer_nll", []) if r["variant"] == "*"]} for p in pats
    }
    if all(v["by_length"] for v in nll_rows.values()):
        accuracy_vs_length(
            nll_rows,
            plots / "answer_loss_vs_length.png",
            metric="answer_nll",
            window=W,
            ylim=None,
            ylabel="answer loss (nats/token)",
        )
    ppl_curve({p: evals[p]["ppl"] for p in pats}, plots / "ppl_by_position.png")
    (out / "report.md").write_text(report)
    results = {
        "config": dataclasses.asdict(rc),
        "trained": trained,
        "checks": checks,
        "accuracy": {p: evals[p]["summary"]["by_length"] for p in pats},
        "by_variant": {p: evals[p]["summary"]["by_variant"] for p in pats},
        "ppl": {p: {k: v for k, v in evals[p]["ppl"].items() if k != "buckets"} for p in pats},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return report


def expected_checks(
    rc: RecipeConfig, evals: dict[str, dict], lengths: list[int], beyond: list[int]
) -> list[dict]:
    """The issue's expectations, as measured: hybrid > pure KDA on multi-key retrieval; hybrid > pure
    MLA past the training length (task accuracy and loss)."""
    out = []
    h, l_, m = rc.reference_pattern, "L", "M"
    if h in evals and l_ in evals:
        a = _variant_acc(evals[h]["summary"], "niah", "multikey", lengths)
        b = _variant_acc(evals[l_]["summary"], "niah", "multikey", lengths)
        claim = f"{h} beats {l_} on multi-key retrieval (niah multikey, all lengths)"
        out.append(_check(claim, a[0], b[0], True, noise=_two_se(a, b)))
        na, nb = (_nll(evals[p], "niah", "multikey", lengths) for p in (h, l_))
        out.append(_check(f"{h} has lower multi-key answer loss than {l_} (all lengths)", na, nb, False))
    if h in evals and m in evals and beyond:

        def acc_beyond(p: str) -> tuple[float, int]:
            rows = evals[p]["summary"]["by_length"]
            return _pooled_acc([r for r in rows if r["task"] in rc.eval_tasks and r["length"] in beyond])

        a, b = acc_beyond(h), acc_beyond(m)
        claim = f"{h} beats {m} on task accuracy past the training window"
        out.append(_check(claim, a[0], b[0], True, noise=_two_se(a, b)))
        na, nb = (
            sum(_nll(evals[p], t, "*", beyond) for t in rc.eval_tasks) / len(rc.eval_tasks) for p in (h, m)
        )
        out.append(_check(f"{h} has lower answer loss than {m} past the training window", na, nb, False))
        out.append(
            _check(
                f"{h} has lower loss than {m} past the training window",
                evals[h]["ppl"]["beyond"],
                evals[m]["ppl"]["beyond"],
                False,
            )
        )
    return out


def _nll(ev: dict[str, Any], task: str, variant: str, lengths: list[int]) -> float:
    xs = [
        r["answer_nll"]
        for r in ev.get("answer_nll", [])
        if r["task"] == task and r["variant"] == variant and r["length"] in lengths
    ]
    return sum(xs) / len(xs) if xs else math.nan


def _check(
    claim: str, a: float, b: float, higher_is_better: bool, noise: float | None = None
) -> dict[str, Any]:
    """Verdict on ``a`` vs ``b``; with ``noise`` (two standard errors of ``a - b``), a smaller gap is
    reported as within noise rather than as a confirmation or a refutation."""
    evidence = f"{_f(a, 3)} vs {_f(b, 3)}"
    if noise is not None and noise == noise and noise > 0:
        evidence += f", 2 SE {_f(noise, 3)}"
    if a != a or b != b:
        verdict = "not measured"
    elif a == b:
        verdict = "not shown (tie)"
    elif noise is not None and noise == noise and abs(a - b) <= noise:
        verdict = "within noise: " + ("leans yes" if (a > b) == higher_is_better else "leans no")
    else:
        verdict = "confirmed" if (a > b) == higher_is_better else "not confirmed"
    return {"claim": claim, "verdict": verdict, "evidence": evidence, "a": a, "b": b}
