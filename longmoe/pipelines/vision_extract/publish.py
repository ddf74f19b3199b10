"""Committed results of the recipe: a finished run copied into ``docs/results`` and the tables
``bench.tables`` writes into docs/vision.md from them.

``publish(run_dir, name)`` writes ``docs/results/vision_extract_<name>_results.json`` (the run's
``results.json`` with its provenance: the image model's ``--stage main`` run's when there was one,
else the final run's; the final run's under ``finish``, each stage's under ``stages``),
``docs/results/vision_extract_<name>_report.md`` and its plots under ``docs/figures/vision/``. A run
whose provenance names a dirty tree is refused unless ``allow_dirty``. ``python -m bench.tables
--vision-extract RUN_DIR NAME`` calls it, then rewrites the tables.

The tables (``document_tables``) read every ``vision_extract_documents*_results.json``: the arms of
the four-family model side by side per family, where its errors are, what each run cost, and (when
``OUT/pdf_eval`` holds an evaluation of the main model with ``--extract-input pdf``) the same pages
read from PDFs through the server's file path against the images.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from longmoe.eval.extract.harness import RESULTS_FILE, f1_with_interval, summarize
from longmoe.pipelines.vision_extract.errors import error_table
from longmoe.runlog import read_jsonl

DOCUMENTS = "documents"  # the main arm's name: vision_extract_documents_results.json
STAGES = ("main", "control")
PDF_EVAL = (
    "pdf_eval"  # OUT/pdf_eval/: `longmoe eval --tasks extract --extract-input pdf --out` of the main model
)


class PublishError(RuntimeError):
    pass


def _json(p: Path) -> dict[str, Any] | None:
    return json.loads(p.read_text()) if p.is_file() else None


def publish(run_dir: Path, name: str, root: Path, allow_dirty: bool = False, arm: str | None = None) -> Path:
    """Copy a finished run into ``root/docs/results`` as ``vision_extract_<name>``; returns the JSON."""
    res = _json(run_dir / "results.json")
    if res is None:
        raise PublishError(f"{run_dir}: no results.json (finish the run without --stage first)")
    prov = _json(run_dir / "provenance.json") or {}
    stages = {s: p for s in STAGES if (p := _json(run_dir / f"provenance.{s}.json")) is not None}
    dirty = [
        str(p.get("commit")) for p in (prov, *stages.values()) if str(p.get("commit")).endswith("+dirty")
    ]
    if dirty and not allow_dirty:
        raise PublishError(f"{run_dir}: made from a dirty tree ({', '.join(dirty)}); rerun from a commit, "
                           "or pass --allow-dirty to keep it stamped")  # fmt: skip
    # the headline is the image model's: its stage's provenance on top when it ran as a stage (the
    # finishing run only read the stored models and wrote the report), every part kept beside it
    res["provenance"] = {**stages.get("main", prov), "finish": prov, "stages": stages}
    pdf = run_dir / PDF_EVAL / RESULTS_FILE
    if pdf.is_file():
        res["pdf_check"] = pdf_check(read_jsonl(run_dir / "main" / "eval" / RESULTS_FILE), read_jsonl(pdf))
    res["config"] = _json(run_dir / "config.json")
    res["arm"] = arm or name
    stem = f"vision_extract_{name}"
    out = root / "docs" / "results" / f"{stem}_results.json"
    out.write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n")
    figs = root / "docs" / "figures" / "vision"
    figs.mkdir(parents=True, exist_ok=True)
    report = (run_dir / "report.md").read_text()
    for plot in ("curve", "examples"):
        src = run_dir / "plots" / f"{plot}.png"
        if src.is_file():
            shutil.copyfile(src, figs / f"{stem}_{plot}.png")
            report = report.replace(f"(plots/{plot}.png)", f"(../figures/vision/{stem}_{plot}.png)")
    (root / "docs" / "results" / f"{stem}_report.md").write_text(report)
    return out


def pdf_check(image_rows: list[dict], pdf_rows: list[dict]) -> dict[str, dict]:
    """Per family, on the pages read both ways (the same held-out seeds): the image model's summary
    cell from the page's pixels and from the page written as a PDF and rendered by the server's file
    path (``longmoe eval --tasks extract --extract-input pdf``), and how many answers were identical."""
    by_id = {r["id"]: r for r in image_rows}
    pairs = [(by_id[r["id"]], r) for r in pdf_rows if r["id"] in by_id]
    out = {}
    for fam in dict.fromkeys(r["family"] for r, _ in pairs):
        img = [a for a, _ in pairs if a["family"] == fam]
        via = [b for a, b in pairs if a["family"] == fam]
        same = sum(a["prediction"] == b["prediction"] for a, b in zip(img, via))
        out[fam] = {"n": len(img), "image": summarize(img)["families"][fam],
                    "pdf": summarize(via)["families"][fam], "same_answer": same}  # fmt: skip
    return out


def pdf_table(check: dict[str, dict]) -> str:
    lines = ["| family | pages | field F1, image [95% CI] | field F1, PDF [95% CI] | same answer |",
             "|---|---|---|---|---|"]  # fmt: skip
    for fam, c in check.items():
        lines.append(f"| {fam} | {c['n']} | {f1_with_interval(c['image'])} | {f1_with_interval(c['pdf'])} "
                     f"| {c['same_answer']} of {c['n']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _arms(root: Path) -> dict[str, dict]:
    """name -> result of every published documents arm, the main arm first."""
    files = sorted((root / "docs" / "results").glob(f"vision_extract_{DOCUMENTS}*_results.json"))
    arms = {p.name.removeprefix("vision_extract_").removesuffix("_results.json"): json.loads(p.read_text())
            for p in files}  # fmt: skip
    return dict(sorted(arms.items(), key=lambda kv: kv[0] != DOCUMENTS))


def _models(arms: dict[str, dict]) -> list[tuple[str, str, dict, dict, str]]:
    """Every distinct trained model of the arms: ``(arm label, "image" | "text-grid control", run,
    held-out cells, stage)``; an arm that reuses the main arm's image model (a longer control, say)
    adds only its control."""
    main_run = arms[DOCUMENTS]["main"]
    out = []
    for name, a in arms.items():
        if name == DOCUMENTS or a["main"] != main_run:
            out.append((a["arm"], "image", a["main"], a["main_eval"], "main"))
        if a.get("control"):
            out.append((a["arm"], "text-grid control", a["control"], a["control_eval"], "control"))
    return out


def family_table(arms: dict[str, dict]) -> str:
    """Per family: each model's held-out field F1 [95% CI], then the main arm's exact match and
    valid JSON (image)."""
    main = arms[DOCUMENTS]
    cols = [(f"{kind}, {arm}", ev) for arm, kind, _, ev, _ in _models(arms)]
    head = (
        "| family | n | " + " | ".join(c for c, _ in cols) + " | exact match (image) | valid JSON (image) |"
    )
    lines = [head, "|---|---|" + "---|" * len(cols) + "---|---|"]
    for fam, c in main["main_eval"].items():
        cells = [f1_with_interval(ev[fam]) if fam in ev else "-" for _, ev in cols]
        lines.append(f"| {fam} | {c['n']} | " + " | ".join(cells)
                     + f" | {c['exact']:.3f} | {c['valid']:.3f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def runs_table(arms: dict[str, dict]) -> str:
    """What each run was and cost: patch size, steps x pages, training wall and CPU minutes, the
    whole stage's CPU minutes (training, held-out curve and evaluation; "-" where the stage's
    provenance was not kept), and the commit it started from."""
    lines = [
        "| run | patch | steps × pages | training, wall min | training, CPU min | stage, CPU min | commit |",
        "|---|---|---|---|---|---|---|",
    ]
    cfgs = {a["arm"]: (a.get("config") or {}, a["provenance"].get("stages", {})) for a in arms.values()}
    for arm, kind, run, _, stage in _models(arms):
        cfg, stages = cfgs[arm]
        patch = cfg.get("patch_size") if stage == "main" else "8 (grid cells)"
        cpu, st = run.get("cpu_seconds"), stages.get(stage, {})
        lines.append(
            f"| {kind}, {arm} | {patch} | {run['steps']} × {cfg.get('batch_size', '?')} | "
            f"{run['seconds'] / 60:.1f} | " + (f"{cpu / 60:.1f}" if cpu is not None else "-") + " | "
            + (f"{st['cpu_s'] / 60:.1f}" if "cpu_s" in st else "-") + f" | {st.get('commit', '-')} |"
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def document_tables(root: Path) -> dict[str, str]:
    """The docs/vision.md blocks, by name; none before the main arm is published."""
    arms = _arms(root)
    if DOCUMENTS not in arms:
        return {}
    out = {"vision_extract:documents": family_table(arms), "vision_extract:documents-runs": runs_table(arms)}
    if arms[DOCUMENTS].get("pdf_check"):
        out["vision_extract:documents-pdf"] = pdf_table(arms[DOCUMENTS]["pdf_check"])
    if arms[DOCUMENTS].get("errors"):
        out["vision_extract:documents-errors"] = error_table(arms[DOCUMENTS]["errors"])
    return out
