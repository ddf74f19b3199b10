"""The vision_extract recipe on the four document families: the ``documents`` preset, the two stages
run side by side and finished by a plain run, and the classification of the remaining errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from longmoe.cli import main as cli_main
from longmoe.eval.extract.harness import canonical_json, flatten
from longmoe.pipelines.vision_extract.__main__ import load_config, main, parse_args
from longmoe.pipelines.vision_extract.config import DOCUMENT_FAMILIES, VisionExtractConfig, documents
from longmoe.pipelines.vision_extract.errors import ROTATED_DEG, TAGS, classify, error_table, field_tags
from longmoe.pipelines.vision_extract.publish import (
    PublishError,
    document_tables,
    family_table,
    publish,
    runs_table,
)
from longmoe.tasks.documents import held_out_seeds, render


def test_documents_preset_trains_and_targets_each_of_the_four_families():
    rc = load_config(parse_args(["--preset", "documents"]))
    assert sorted(rc.mix) == sorted(DOCUMENT_FAMILIES) == sorted(rc.targets())
    assert rc.eval_families == DOCUMENT_FAMILIES and rc.validation_families() == DOCUMENT_FAMILIES
    assert rc.curve_families == DOCUMENT_FAMILIES and rc.control_grid == 64
    # the forms default keeps one target family and its own validation family
    assert VisionExtractConfig().targets() == ["form_varied"] == VisionExtractConfig().validation_families()
    fine = load_config(parse_args(["--preset", "documents", "--patch-size", "4", "--batch-size", "8"]))
    assert fine.patch_size == 4 and fine.batch_size == 8
    assert fine.model_config().max_seq_len >= (256 // 4) ** 2 + 256  # a full page of 4-px patches fits
    assert VisionExtractConfig().model_config().max_seq_len == 4096  # 8-px models unchanged


def test_family_lists_are_validated():
    for name in ("curve_families", "val_families", "target_families"):
        with pytest.raises(ValueError, match=f"{name}="):
            VisionExtractConfig(**{name: ["poster"]})
    with pytest.raises(ValueError, match="control_grid=0"):
        VisionExtractConfig(control_grid=0)
    assert main(["--quick", "--stage", "everything"]) == 2


def test_stages_side_by_side_then_a_plain_run_finishes(tmp_path, capsys):
    rc = dataclasses.replace(
        documents(), d_model=32, steps=2, batch_size=2, eval_n=2, curve_n=4, curve_every=2, val_n=1,
        control_search_steps=1, control_lrs=[1e-2, 3e-2], pretrain_steps=2, pretrain_seq_len=64,
        pretrain_batch=2, pretrain_image_rows=1, pretrain_val_batches=1,
    )  # fmt: skip
    cfg, out = tmp_path / "c.json", tmp_path / "vx"
    rc.save(cfg)
    base = ["--config", str(cfg), "--out", str(out)]
    assert main([*base, "--stage", "control"]) == 0
    assert not (out / "main").exists() and (out / "pretrain_check.json").is_file()
    assert main([*base, "--stage", "main"]) == 0
    for stage in ("main", "control"):
        p = json.loads((out / f"provenance.{stage}.json").read_text())
        assert p["cpu_s"] > 0 and "commit" in p
    trained = (out / "main" / "run.json").read_text()
    assert json.loads(trained)["cpu_seconds"] > 0
    assert main(base) == 0  # reads both stages: nothing retrained
    assert (out / "main" / "run.json").read_text() == trained
    res = json.loads((out / "results.json").read_text())
    assert list(res["main_eval"]) == list(res["control_eval"]) == DOCUMENT_FAMILIES
    assert res["control_lr"]["val_family"] == ", ".join(DOCUMENT_FAMILIES)
    assert set(res["errors"]) == set(DOCUMENT_FAMILIES)
    report = (out / "report.md").read_text()
    for fam in DOCUMENT_FAMILIES:
        assert f"**{fam} held-out field F1:" in report
    assert "Where the image model's errors are" in report
    capsys.readouterr()
    # the main model read from PDFs through the server's file path, on the same held-out pages
    fams = ",".join(DOCUMENT_FAMILIES)
    pdf = ["eval", "--tasks", "extract", "--model", str(out / "main" / "model"), f"--families={fams}"]
    assert cli_main([*pdf, "--n", "1", "--extract-input", "pdf", "--out", str(out / "pdf_eval")]) == 0
    # published: the results with every stage's provenance, and the tables docs/vision.md gets
    root = tmp_path / "repo"
    (root / "docs" / "results").mkdir(parents=True)
    (out / "provenance.json").write_text(json.dumps({"commit": "abc1234+dirty", "cpu_s": 1.0}))
    with pytest.raises(PublishError, match="dirty tree"):
        publish(out, "documents", root)
    path = publish(out, "documents", root, allow_dirty=True, arm="8-px")
    pub = json.loads(path.read_text())
    assert set(pub["provenance"]["stages"]) == {"main", "control"} and pub["config"]["patch_size"] == 8
    assert pub["provenance"]["command"] == pub["provenance"]["stages"]["main"]["command"]
    assert pub["provenance"]["finish"]["commit"] == "abc1234+dirty"
    assert (
        "../figures/vision/vision_extract_documents_curve.png"
        in path.with_name("vision_extract_documents_report.md").read_text()
    )
    tables = document_tables(root)
    assert set(tables) == {f"vision_extract:documents{s}" for s in ("", "-runs", "-errors", "-pdf")}
    assert (
        all(c["n"] == 1 for c in pub["pdf_check"].values())
        and "| table | 1 |" in tables["vision_extract:documents-pdf"]
    )
    for fam in DOCUMENT_FAMILIES:
        assert f"| {fam} | 2 |" in tables["vision_extract:documents"]
    assert (
        "text-grid control" in tables["vision_extract:documents"]
        and "| image, 8-px | 8 |" in tables["vision_extract:documents-runs"]
    )


def _row(doc, fields) -> dict:
    return {"family": doc.family, "seed": doc.seed, "prediction": canonical_json(fields)}


def test_error_classification_counts_wrong_and_missing_fields_by_tag():
    cfg = documents().vision_config()
    docs = [render(f, s) for f in DOCUMENT_FAMILIES for s in held_out_seeds(6)]
    perfect = classify([_row(d, d.fields) for d in docs], cfg)
    assert all(c["wrong"] == 0 and c["pages"] == 6 for c in perfect.values())
    n = sum(c["fields"] for c in perfect.values())
    assert n == sum(len(flatten(d.fields)) for d in docs)
    # drop the figure's bar/point count (read from the chart) and change a receipt's total
    fig, rec = render("figure_page", 10**9), render("receipt", 10**9)
    bad_fig = {**fig.fields, "figure": {k: v for k, v in fig.fields["figure"].items() if k != "count"}}
    bad_rec = {**rec.fields, "total": "0.00"}
    got = classify([_row(fig, bad_fig), _row(rec, bad_rec)], cfg)
    assert got["figure_page"]["wrong"] == 1 and got["figure_page"]["tags"]["not_text"]["wrong"] == 1
    assert got["receipt"]["wrong"] == 1 and got["receipt"]["tags"]["number"]["wrong"] == 1
    assert "| figure_page | 1 | 1 /" in error_table(got) and all(t in error_table(got) for t in TAGS)


def test_field_tags_follow_the_page():
    cfg = documents().vision_config()
    for seed in range(20):
        doc = render("receipt", seed)
        tags = field_tags(doc, cfg)
        assert set(tags) == set(flatten(doc.fields))
        assert all(("rotated" in t) == (abs(doc.rotation) >= ROTATED_DEG) for t in tags.values())
        assert "number" in tags["total"] and "not_text" not in tags["total"]
    fig = render("figure_page", 0)
    assert "not_text" in field_tags(fig, cfg)["figure.kind"]


def test_an_arm_that_reuses_the_main_image_model_adds_only_its_control():
    cell = {"n": 4, "micro_f1": 0.5, "micro_f1_lo": 0.25, "micro_f1_hi": 0.75, "exact": 0.0, "valid": 1.0}
    run = {"steps": 10, "seconds": 60.0, "cpu_seconds": 30.0}
    base = {"main": run, "main_eval": {"form": cell}, "provenance": {}, "config": {"batch_size": 2}}
    arms = {
        "documents": {**base, "arm": "8-px", "control": run, "control_eval": {"form": cell}},
        "documents_long": {**base, "arm": "long control", "control": {**run, "steps": 40},
                           "control_eval": {"form": {**cell, "micro_f1": 0.9}}},
        "documents_patch4": {**base, "arm": "4-px", "main": {**run, "steps": 11}},
    }  # fmt: skip
    head = family_table(arms).splitlines()[0]
    assert head.count("image,") == 2 and head.count("text-grid control,") == 2
    assert "| 0.900 [0.250, 0.750] |" in family_table(arms)
    assert [line.split(" | ")[0] for line in runs_table(arms).splitlines()[2:]] == [
        "| image, 8-px",
        "| text-grid control, 8-px",
        "| text-grid control, long control",
        "| image, 4-px",
    ]
