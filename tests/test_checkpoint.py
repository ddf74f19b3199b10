"""The run directory (longmoe.checkpoint): layout, atomic checkpoints, model-dir lookup, the one loader."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from longmoe import checkpoint as ckpt
from longmoe.data.tokenizer import tokenizer_for_tests
from longmoe.model import LongMoE
from longmoe.presets import preset


@pytest.fixture(scope="module")
def tok():
    return tokenizer_for_tests(512)


def tiny_model(tok, seed: int = 0) -> LongMoE:
    torch.manual_seed(seed)
    cfg = preset("tiny").replace(
        vocab_size=tok.vocab_size, d_model=64, n_layers=4, kda_heads=2, kda_head_dim=16, kda_gate_rank=8,
        mla_heads=2, mla_head_dim=16, mla_v_head_dim=16, mla_q_lora_rank=32, mla_kv_lora_rank=16,
        attn_res_blocks=2, max_seq_len=256,
    )  # fmt: skip
    return LongMoE(cfg)


def make_run(run, tok, steps=(1, 2, 3), final=True, windows=(64, 128)):
    """A run directory as training leaves it: tokenizer, train config, checkpoints, final/."""
    run.mkdir(parents=True)
    tok_file = tok.save(run / ckpt.TOKENIZER_FILE)
    if windows:
        stages = [{"name": f"s{w}", "window": w, "tokens": w} for w in windows]
        (run / ckpt.TRAIN_CONFIG).write_text(json.dumps({"stages": stages}))
    model = None
    for s in steps:
        model = tiny_model(tok, seed=s)
        ckpt.save_checkpoint(run, s, model, tok_file, {"step": s}, keep_last=5)
    if final:
        model = tiny_model(tok, seed=99)
        ckpt.save_model_dir(run / ckpt.FINAL_DIR, model, tok)
    return model


def test_resolve_model_dir(tmp_path, tok):
    with pytest.raises(FileNotFoundError, match="not found"):
        ckpt.resolve_model_dir(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a model directory"):
        ckpt.resolve_model_dir(tmp_path / "empty")
    make_run(tmp_path / "r", tok)
    assert ckpt.resolve_model_dir(tmp_path / "r") == tmp_path / "r/final"
    assert ckpt.resolve_model_dir(tmp_path / "r/final") == tmp_path / "r/final"
    shutil.rmtree(tmp_path / "r/final")
    assert ckpt.resolve_model_dir(tmp_path / "r").name == "step-00000003"


def test_layout_names():
    """The names other stages and existing runs depend on."""
    assert (ckpt.FINAL_DIR, ckpt.CKPT_DIR, ckpt.STEP_PREFIX) == ("final", "checkpoints", "step-")
    assert (ckpt.TRAIN_CONFIG, ckpt.METRICS) == ("train_config.json", "metrics.jsonl")
    assert ckpt.MODEL_FILES == ("config.json", "model.safetensors", "tokenizer.json")
    assert ckpt.step_dir("R", 12).as_posix() == "R/checkpoints/step-00000012"


def test_load_model_gives_model_tokenizer_and_meta(tmp_path, tok):
    final = make_run(tmp_path / "r", tok)
    model, t, meta = ckpt.load_model(tmp_path / "r")
    assert meta.model_dir == tmp_path / "r/final" and meta.config == final.cfg
    assert meta.training_window == 128  # the run's longest curriculum window, not max_seq_len
    assert not model.training and t.vocab_size == tok.vocab_size
    x = torch.randint(0, tok.vocab_size, (1, 12))
    with torch.no_grad():
        assert torch.equal(model(x).logits, final.eval()(x).logits)
    # a checkpoint two levels below the run finds the run's train_config.json
    step = ckpt.load_model(tmp_path / "r/checkpoints/step-00000002")
    assert step.meta.training_window == 128 and step.meta.model_dir.name == "step-00000002"
    # a bare model directory (no run around it): the config's max_seq_len
    shutil.copytree(tmp_path / "r/final", tmp_path / "bare")
    assert ckpt.load_model(tmp_path / "bare").meta.training_window == 256


def test_checkpoints_verify_prune_and_fall_back(tmp_path, tok, caplog):
    make_run(tmp_path / "r", tok, steps=(1, 2, 3), final=False)
    tok_file = tmp_path / "r" / ckpt.TOKENIZER_FILE
    ckpt.save_checkpoint(tmp_path / "r", 4, tiny_model(tok, 4), tok_file, {"step": 4}, keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "r")] == ["step-00000003", "step-00000004"]
    newest = ckpt.step_dir(tmp_path / "r", 4)
    w = newest / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    w.write_bytes(bytes(data))
    assert not ckpt.is_complete(newest) and ckpt.is_complete(newest, verify_hashes=False)
    path, state = ckpt.load_latest(tmp_path / "r")
    assert path.name == "step-00000003" and state == {"step": 3}
    assert "corrupt" in caplog.text
    (ckpt.step_dir(tmp_path / "r", 3) / ckpt.MANIFEST).unlink()  # a save that never finished
    assert ckpt.load_latest(tmp_path / "r") is None


def test_load_weights_in_place(tmp_path, tok):
    src, dst = tiny_model(tok, 1), tiny_model(tok, 2)
    ckpt.save_model_dir(tmp_path / "m", src, tok)
    p = dst.embed.weight
    ckpt.load_weights(dst, tmp_path / "m")
    assert dst.embed.weight is p and torch.equal(p, src.embed.weight)
