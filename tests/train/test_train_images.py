"""Training on interleaved image-text documents: the trainer encodes each batch's images and trains
the vision encoder with the language model on text targets; resuming continues the same data."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

from longmoe.config import VisionConfig
from longmoe.data.corpus import split_of
from longmoe.data.stages import CurriculumStage
from longmoe.runlog import read_metrics
from longmoe.train.config import TrainConfig
from longmoe.train.pretrain import Trainer
from tests.helpers.train import small_model_config

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 230)}
VIS = VisionConfig(patch_size=8, max_image_side=32, encoder="vit", width=32, depth=1, heads=2)


def write_corpus(root: Path, n_train: int = 24) -> str:
    """Image documents (a coloured shape and its caption) in ``root/docs.jsonl``, with at least two rows
    in the validation split; returns the path relative to ``root`` (the split hashes it)."""
    (root / "img").mkdir()
    lines, i, n_val = [], 0, 0
    while i - n_val < n_train or n_val < 2:
        name = list(COLOURS)[i % 3]
        w, h = 16 + 8 * (i % 3), 32 - 8 * (i % 2)
        img = Image.new("RGB", (w, h), "white")
        ImageDraw.Draw(img).ellipse([2, 2, w - 3, h - 3], fill=COLOURS[name])
        img.save(root / "img" / f"{i}.png")
        segs = [{"text": f"Figure {i}:"}, {"image": f"img/{i}.png"}, {"text": f" a {name} ellipse."}]
        lines.append(json.dumps({"segments": segs}))
        i += 1
        n_val += split_of(f"docs.jsonl:{i}") == "val"
    (root / "docs.jsonl").write_text("\n".join(lines) + "\n")
    return "docs.jsonl"


def config(data: str) -> TrainConfig:
    stages = [CurriculumStage("a", window=48, tokens=48 * 2 * 6, batch_size=2)]
    return TrainConfig(stages=stages, data=data, warmup_steps=1, eval_every=3, ckpt_every=2, val_windows=1)


def losses(run_dir: Path) -> list:
    return [(r["step"], r["loss"], r.get("val_loss")) for r in read_metrics(run_dir)]


def test_trains_on_image_documents_and_resumes_exactly(tmp_path, monkeypatch, tok):
    monkeypatch.chdir(tmp_path)
    tcfg = config(write_corpus(tmp_path))
    mcfg = small_model_config().replace(vision=VIS)
    full = Trainer(tmp_path / "full", mcfg, tcfg, tok, progress=False)
    init = {k: v.detach().clone() for k, v in full.model.vision.state_dict().items()}
    batch = full.curriculum.next_batch()  # the data carries images, their patches fill the spans
    assert batch.images and sum(p.n for p in batch.images) == int((batch.input_ids == 11).sum())
    assert not ({9, 10, 11} & set(batch.labels.flatten().tolist()))
    full.curriculum = full.make_data()  # back to the start
    full.fit()
    rec = read_metrics(tmp_path / "full")
    assert len(rec) == tcfg.total_steps == 6
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rec)
    assert rec[-1]["loss"] < rec[0]["loss"]
    moved = [k for k, v in full.model.vision.state_dict().items() if not torch.equal(v, init[k])]
    assert "patch_proj.weight" in moved and "blocks.0.qkv.weight" in moved  # the encoder trains
    assert any("val_loss" in r for r in rec)

    Trainer(tmp_path / "cut", mcfg, tcfg, tok, progress=False, max_steps=3).fit()
    cut = Trainer(tmp_path / "cut", resume=True, progress=False)
    assert cut.step == 3  # fit() checkpoints where it stops
    cut.fit()
    assert losses(tmp_path / "full") == losses(tmp_path / "cut")  # bit-identical, val losses too


@pytest.mark.slow(wall="not measured")
def test_training_reads_the_pixels(tmp_path, monkeypatch, tok):
    """The whole path (JSONL -> packing -> encoder -> image_embeds -> loss) carries what is in the image:
    after 150 steps on "Picture: <image> The box is <colour>." (six colours drawn at random, so the text
    alone gives 1 in 6) the held-out colour is named right in at least 80% of new images (measured 100%
    for both encoders)."""
    from longmoe.data.images import image_span, patchify

    monkeypatch.chdir(tmp_path)
    colours = {**COLOURS, "black": (10, 10, 10), "yellow": (240, 220, 20), "purple": (150, 40, 170)}
    rng = random.Random(0)

    def draw(name: str, r: random.Random) -> Image.Image:
        rgb = tuple(max(0, min(255, v + r.randint(-25, 25))) for v in colours[name])
        return Image.new("RGB", (r.choice([16, 24, 32]), r.choice([16, 24])), rgb)

    lines = []
    for i in range(400):
        name = rng.choice(list(colours))
        draw(name, rng).save(tmp_path / f"{i}.png")
        segs = [{"text": "Picture:"}, {"image": f"{i}.png"}, {"text": f" The box is {name}."}]
        lines.append(json.dumps({"segments": segs}))
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    vision = VisionConfig(patch_size=8, max_image_side=32, encoder="linear")
    mcfg = small_model_config().replace(vision=vision)
    stages = [CurriculumStage("a", window=64, tokens=64 * 4 * 150, batch_size=4)]
    tcfg = TrainConfig(
        stages=stages, data="d.jsonl", warmup_steps=10, eval_every=0, ckpt_every=0, val_windows=1
    )
    tr = Trainer(tmp_path / "run", mcfg, tcfg, tok, progress=False)
    tr.fit()
    m, held, right, n = tr.model.eval(), random.Random(999), 0, 30
    words = {c: tok.encode(" " + c) for c in colours}
    with torch.no_grad():
        for _ in range(n):
            name = held.choice(list(colours))
            p = patchify(draw(name, held), vision)
            ids = [tok.bos_id] + tok.encode("Picture:") + image_span(p, tok) + tok.encode(" The box is")
            emb, score = m.encode_images([p]), {}
            for c, w in words.items():  # log-likelihood of each colour's tokens after the prompt
                lp = m(torch.tensor([ids + w]), image_embeds=emb).logits[0].log_softmax(-1)
                score[c] = sum(float(lp[len(ids) - 1 + j, t]) for j, t in enumerate(w))
            right += max(score, key=score.get) == name
    assert right / n >= 0.8, right / n


def test_images_under_torchrun_are_refused_on_the_global_batch(tmp_path, monkeypatch, tok):
    """Every rank holds the same global batch, so every rank refuses it (none waits in a collective)."""
    from longmoe.config import ConfigError
    from longmoe.train.parallel import Sharded

    monkeypatch.chdir(tmp_path)
    mcfg, tcfg = small_model_config().replace(vision=VIS), config(write_corpus(tmp_path))
    tr = Trainer(tmp_path / "r", mcfg, tcfg, tok, progress=False)
    batch = tr.curriculum.next_batch()
    tr.par.check_images(batch)  # one process: fine
    tr.par = Sharded(tr.par.dims, tr.par.device, mesh=object())  # as under torchrun
    with pytest.raises(ConfigError, match="one process only"):
        tr.par.check_images(batch)
    tr.par.check_images(batch.replace(images=[]))  # text batches still train
