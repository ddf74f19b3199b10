"""The vision_extract recipe: training rows (loss on the JSON only, never on image tokens), the prompt
the evaluation uses, the config's checks, and the quick run end to end (resumable, report written,
the saved model readable by ``longmoe eval --tasks extract``)."""

from __future__ import annotations

import json

import pytest
import torch

from longmoe.cli import main as cli_main
from longmoe.config import IGNORE_INDEX
from longmoe.eval.extract.local import decode_documents, prompt_ids
from longmoe.pipelines.vision_extract.__main__ import main
from longmoe.pipelines.vision_extract.config import VisionExtractConfig, quick
from longmoe.pipelines.vision_extract.data import char_tokenizer, make_rows, train_batch, train_seed
from longmoe.pipelines.vision_extract.train import build_model
from longmoe.tasks.documents import HELD_OUT_SEED_BASE, render


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
    ]
    rc = load_config(parse_args(argv))
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
