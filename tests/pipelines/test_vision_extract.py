"""The vision_extract recipe: training rows (loss on the JSON only, never on image tokens), the prompt
the evaluation uses, the config's checks, and the quick run end to end (resumable, report written,
the saved model readable by ``longmoe eval --tasks extract``)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from longmoe.cli import main as cli_main
from longmoe.config import IGNORE_INDEX
from longmoe.data.images import patchify
from longmoe.eval.extract.local import decode_documents, prompt_ids
from longmoe.eval.extract.textgrid import text_grid
from longmoe.pipelines.vision_extract.__main__ import main
from longmoe.pipelines.vision_extract.config import VisionExtractConfig, quick
from longmoe.pipelines.vision_extract.data import (
    char_tokenizer,
    make_rows,
    reading_targets,
    train_batch,
    train_seed,
)
from longmoe.pipelines.vision_extract.train import build_model
from longmoe.tasks.documents import HELD_OUT_SEED_BASE, render
from longmoe.tasks.documents.forms import EASY_VALUE_COL


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def test_char_tokenizer_is_one_token_per_character(tok):
    s = '{"code":"A1B2","zip":"X9"}'
    assert len(tok.encode(s)) == len(s) and tok.decode(tok.encode(s)) == s


def test_greedy_answers_never_contain_image_tokens(tok, monkeypatch):
    """An untrained model may rank an image-span token first; decoding one would feed <|image_patch|>
    with no patches back in (a crash in the middle of an evaluation), so decode skips those ids."""
    model = build_model(quick())
    image_ids = [tok.image_start_id, tok.image_patch_id, tok.image_end_id]
    forward = model.forward

    def favour_image_tokens(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits[..., image_ids] += 1e4  # every position's top choices are the image tokens
        return out

    monkeypatch.setattr(model, "forward", favour_image_tokens)
    docs = [render("form_easy", s) for s in range(3)]
    replies = decode_documents(model, tok, docs, [5] * len(docs))
    assert len(replies) == 3
    for r in replies:
        assert not set(image_ids) & set(tok.encode(r.text))


@pytest.mark.parametrize("inputs", ["image", "text"])
def test_rows_put_loss_on_the_json_only(tok, inputs):
    model = build_model(quick())
    d = render("form_easy", 4)
    rows, labels, images = make_rows([d], tok, model, inputs)
    prompt, patches = prompt_ids(d, tok, model, inputs)
    ids, lab = rows[0], labels[0]
    assert ids[: len(prompt)] == prompt  # training starts with exactly what evaluation asks
    kept = [t for t in lab if t != IGNORE_INDEX]
    assert tok.decode(kept[:-1]) == d.target and kept[-1] == tok.eos_id
    assert all(lab[t] == ids[t + 1] for t in range(len(ids) - 1) if lab[t] != IGNORE_INDEX)
    image_ids = {tok.image_start_id, tok.image_patch_id, tok.image_end_id}
    assert not image_ids & set(kept)
    if inputs == "image":
        assert len(images) == 1 and ids.count(tok.image_patch_id) == images[0].n == patches.n
    else:
        assert images == [] and d.text in tok.decode(prompt[1:])


def test_training_seeds_never_reach_the_held_out_range():
    for seed, step in [(0, 0), (3, 10**8), (99, 31_250_000)]:
        assert all(0 <= train_seed(seed, step, 32, i) < HELD_OUT_SEED_BASE for i in range(32))
    assert len({train_seed(0, s, 32, i) for s in range(50) for i in range(32)}) == 50 * 32


def test_batches_are_deterministic(tok):
    rc = quick()
    model = build_model(rc)
    a = train_batch({"form_easy": 1.0, "table": 1.0}, 3, 4, 0, tok, model, "image")
    b = train_batch({"form_easy": 1.0, "table": 1.0}, 3, 4, 0, tok, model, "image")
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert a.input_ids.shape[0] == 4 and len(a.images) == 4
    out = model(a.input_ids, labels=a.labels, image_embeds=model.encode_images(a.images))
    assert torch.isfinite(out.ce_loss)
    mixed = train_batch({"form_easy": 1.0}, 3, 4, 0, tok, model, "image", text_rows=1)
    assert len(mixed.images) == 3 and int((mixed.input_ids[3] == tok.image_patch_id).sum()) == 0


def test_cli_overrides_and_errors(capsys):
    from longmoe.pipelines.vision_extract.__main__ import load_config, parse_args

    argv = [
        "--quick",
        "--steps",
        "9",
        "--mix",
        "form_easy=1,form=0.5",
        "--no-control",
        "--control-steps",
        "4",
        "--control-inputs",
        "text",
        "--control-lrs",
        "1e-3,2e-2",
        "--encoder",
        "linear",
        "--read-weight",
        "0.5",
        "--seed",
        "3",
    ]
    rc = load_config(parse_args(argv))
    assert rc.encoder == "linear" and rc.read_weight == 0.5 and rc.seed == 3
    assert rc.steps == 9 and rc.mix == {"form_easy": 1.0, "form": 0.5} and not rc.text_control
    assert rc.control_steps == 4 and rc.control_inputs == "text" and rc.control_lrs == [1e-3, 2e-2]
    assert main(["--quick", "--mix", "poster=1"]) == 2
    assert "mix=" in capsys.readouterr().err
    assert main(["--quick", "--mix", "form=heavy"]) == 2
    assert "--mix item 'form=heavy'" in capsys.readouterr().err


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="mix="):
        VisionExtractConfig(mix={"poster": 1.0})
    with pytest.raises(ValueError, match="steps=0"):
        VisionExtractConfig(steps=0)
    with pytest.raises(ValueError, match="eval_families="):
        VisionExtractConfig(eval_families=["nope"])
    with pytest.raises(ValueError, match="control_inputs="):
        VisionExtractConfig(control_inputs="pixels")
    with pytest.raises(ValueError, match="control_lrs="):
        VisionExtractConfig(control_lrs=[0.0])
    with pytest.raises(ValueError, match="read_weight="):
        VisionExtractConfig(read_weight=-1.0)
    with pytest.raises(ValueError, match="read_weight=inf"):  # an infinite loss would train on nan
        VisionExtractConfig(read_weight=math.inf)
    with pytest.raises(ValueError, match="conv_stem=0"):
        VisionExtractConfig(conv_stem=0)
    with pytest.raises(ValueError, match="vision.encoder"):
        VisionExtractConfig(encoder="mlp")


def test_reading_targets_name_the_characters_each_patch_holds(tok):
    """form_easy: patch (r, c) reads the character drawn in cell (r, c), a space elsewhere; form_varied:
    every glyph is read by exactly one patch, the one holding its centre after the resize; a text grid:
    each cell its character. Every target row is a distribution."""
    model = build_model(dataclasses.replace(quick(), patch_size=8))
    P, V, sp = 8, model.cfg.vocab_size, tok.encode(" ")[0]
    d = render("form_easy", 4)
    p = patchify(d.image, model.cfg.vision)
    t = reading_targets(d, p, "image", P, tok, V)
    assert t.shape == (p.n, V) and torch.allclose(t.sum(-1), torch.ones(p.n))
    for r, line in enumerate(d.text.split("\n")):
        label, value = line.split(": ")
        cells = {c: ch for c, ch in enumerate(label + ":")}
        cells.update({EASY_VALUE_COL + j: ch for j, ch in enumerate(value)})
        for c in range(p.cols):
            k = r * p.cols + c
            assert t[k].argmax() == tok.encode(cells.get(c, " "))[0] and t[k].max() == 1
    d = render("form_varied", 6)
    p = patchify(d.image, model.cfg.vision)
    t = reading_targets(d, p, "image", P, tok, V)
    read = (t * (t[:, sp : sp + 1] == 0)).sum(0)  # glyph patches only: how much of each character is read
    for ch in {g.char for g in d.glyphs}:
        n = sum(g.char == ch for g in d.glyphs)
        assert 0 < float(read[tok.encode(ch)[0]]) <= n, ch
    assert torch.allclose(t.sum(-1), torch.ones(p.n))
    g = text_grid(d.text, model.cfg.vision)
    t = reading_targets(d, g, "text_grid", P, tok, V)
    for r, line in enumerate(d.text.split("\n")):
        for c in range(g.cols):
            assert t[r * g.cols + c].argmax() == tok.encode(line[c] if c < len(line) else " ")[0]


def test_reading_loss_is_cross_entropy_through_the_tied_head(tok):
    """With one-hot targets the reading loss is the usual cross-entropy of the head's logits; a batch
    of images carries one target row per patch, and a training step lowers the reading loss."""
    import torch.nn.functional as F

    from longmoe.pipelines.vision_extract.train import _step, reading_loss
    from longmoe.train.optim import param_groups

    model = build_model(quick())
    b = train_batch({"form_easy": 1.0, "form_varied": 1.0}, 0, 4, 0, tok, model, "image", text_rows=1)
    assert b.reads.shape == (sum(p.n for p in b.images), model.cfg.vocab_size)
    emb = model.encode_images(b.images)
    ids = b.reads.argmax(-1)
    one_hot = F.one_hot(ids, model.cfg.vocab_size).float()
    assert torch.allclose(reading_loss(model, emb, one_hot), F.cross_entropy(model.token_logits(emb), ids))
    opt = torch.optim.AdamW(param_groups(model, 0.0), lr=1e-2)
    first = [_step(model, opt, b, read_weight=1.0)[1] for _ in range(5)]
    assert first[-1] < first[0]
    assert math.isnan(_step(model, opt, b, read_weight=0.0)[1])  # off: not computed


def test_the_text_grid_control_reads_codes_with_the_linear_projector(tmp_path):
    """A control's grid cells are character codes, not pixels: its model's encoder is linear on 8-px
    cells (a code per ASCII character) even when the image model's is conv on 4-px patches."""
    from longmoe.pipelines.vision_extract.train import train_extractor

    rc = dataclasses.replace(quick(), steps=1, control_steps=1, curve_every=1, curve_n=1, patch_size=4)
    assert rc.encoder == "conv"
    model, _ = train_extractor(rc, char_tokenizer(), tmp_path / "c", "text_grid", log=lambda m: None)
    assert model.cfg.vision.encoder == "linear" and model.cfg.vision.patch_size == 8  # codes up to 190
    model, _ = train_extractor(rc, char_tokenizer(), tmp_path / "i", "image", log=lambda m: None)
    assert model.cfg.vision.encoder == "conv" and model.cfg.vision.patch_size == 4


def test_text_grid_puts_each_character_in_its_row_and_column_cell(tok):
    from longmoe.eval.extract.textgrid import text_grid

    model = build_model(quick())
    vis = model.cfg.vision
    d = render("form_varied", 5)
    g = text_grid(d.text, vis)
    lines = d.text.split("\n")
    assert (g.rows, g.cols) == (len(lines), max(map(len, lines))) and g.pixels.shape == (g.n, vis.patch_dim)
    for r, line in enumerate(lines):
        for c in range(g.cols):
            cell = g.pixels[r * g.cols + c]
            if c < len(line):
                assert cell.sum() == 1 and cell[ord(line[c])] == 1
            else:
                assert cell.sum() == 0  # past the end of the line: blank
    prompt, patches = prompt_ids(d, tok, model, "text_grid")
    assert prompt.count(tok.image_patch_id) == patches.n == g.n
    emb = model.encode_images([patches])  # the image path's encoder, row/column embeddings included
    assert emb.shape == (g.n, model.cfg.d_model)


def test_quick_run_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "vx"
    assert main(["--quick", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["main"]["steps"] == 6 and res["control"]["inputs"] == "text_grid"
    lr = res["control_lr"]
    assert lr["lr"] in (1e-2, 3e-2) and [c["lr"] for c in lr["candidates"]] == [1e-2, 3e-2]
    assert lr["search_steps"] == 2 and lr["budget"] == 6 and res["control"]["steps"] == 6
    assert lr["val_seeds"][0] >= 2 * HELD_OUT_SEED_BASE  # the validation block, not a test page
    assert set(res["main_eval"]) == {"form_easy", "receipt"} and res["pretrain"]["text_tokens"] > 0
    assert (out / "report.md").is_file() and (out / "plots" / "examples.png").is_file()
    report = (out / "report.md").read_text()
    assert "form_easy" in report and "VALIDATION pages" in report and "[95% CI]" in report
    rows = (out / "main" / "eval" / "extract_results.jsonl").read_text().splitlines()
    assert len(rows) == 4 + 2
    # a rerun reads every stored stage (nothing retrained, nothing re-scored)
    assert main(["--quick", "--out", str(out)]) == 0
    assert len((out / "main" / "eval" / "extract_results.jsonl").read_text().splitlines()) == 6
    assert json.loads((out / "results.json").read_text())["main"] == res["main"]
    # the saved model is what ``longmoe eval --tasks extract --model`` reads
    ev = tmp_path / "ev"
    argv = ["eval", "--tasks", "extract", "--model", str(out / "main" / "model"), "--families", "form_easy"]
    assert cli_main([*argv, "--n", "2", "--out", str(ev)]) == 0
    assert len((ev / "extract_results.jsonl").read_text().splitlines()) == 2
    # the text-grid control reads its input the way the recipe trained it
    ctrl = ["eval", "--tasks", "extract", "--model", str(out / "control" / "model"), "--families=form_easy"]
    assert cli_main([*ctrl, "--n", "2", "--extract-input", "text_grid", "--out", str(tmp_path / "cv")]) == 0
    capsys.readouterr()
