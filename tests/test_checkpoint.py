"""The run directory (longmoe.checkpoint): layout, atomic checkpoints, model-dir lookup, the one loader."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from longmoe import checkpoint as ckpt
from longmoe.cli import main
from longmoe.data.stages import CurriculumStage
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.train.config import TrainConfig
from longmoe.train.pretrain import Trainer


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


def weights_of_another_config(tok, model_dir) -> None:
    """Overwrite ``model_dir``'s weights with those of a wider model (its config.json unchanged)."""
    other = LongMoE(tiny_model(tok).cfg.replace(d_model=96))
    other.save_pretrained(model_dir.parent / "other")
    shutil.copyfile(model_dir.parent / "other" / ckpt.WEIGHTS_FILE, model_dir / ckpt.WEIGHTS_FILE)


def test_weights_of_another_config_name_the_file_and_first_tensor(tmp_path, tok):
    """Both loaders (in place, and the one model loader) refuse foreign weights with a UserError."""
    ckpt.save_model_dir(tmp_path / "m", tiny_model(tok), tok)
    weights_of_another_config(tok, tmp_path / "m")
    with pytest.raises(ckpt.CheckpointError, match=r"m/model\.safetensors .*'embed\.weight' is \[512, 96\]"):
        ckpt.load_weights(tiny_model(tok), tmp_path / "m")
    with pytest.raises(ckpt.CheckpointError, match=r"m/model\.safetensors does not match .*shape mismatch"):
        ckpt.load_model(tmp_path / "m")  # from_pretrained's check, as a UserError
    own = tiny_model(tok).state_dict()
    assert ckpt.first_mismatch(own, own) is None
    fewer = {k: v for k, v in own.items() if k != "embed.weight"}
    assert ckpt.first_mismatch(own, fewer) == "it lacks tensor 'embed.weight'"
    assert ckpt.first_mismatch(fewer, own) == "it has tensor 'embed.weight', which the model lacks"


def test_resume_onto_weights_of_another_config_is_one_cli_error_line(tmp_path, tok, capsys):
    """`longmoe train --resume` whose newest checkpoint holds another config's weights (a complete,
    hash-consistent checkpoint: e.g. written by an older longmoe) ends in one error line, no traceback."""
    cfg = preset("tiny").replace(
        vocab_size=512, d_model=32, n_layers=2, layer_pattern="LM", attn_res_blocks=1
    )
    stage = CurriculumStage("a", window=32, tokens=32 * 2 * 3, batch_size=2)
    tcfg = TrainConfig(stages=[stage], ckpt_every=1, eval_every=0, val_windows=1)
    run = tmp_path / "run"
    Trainer(run, cfg, tcfg, tok, progress=False, max_steps=1).fit()
    # step 2: step 1's files with a wider model's weights, sealed like any checkpoint
    tmp = ckpt.tmp_dir(run, 2)
    shutil.copytree(ckpt.step_dir(run, 1), tmp)
    (tmp / ckpt.MANIFEST).unlink()
    LongMoE(cfg.replace(d_model=48)).save_pretrained(tmp_path / "other")
    shutil.copyfile(tmp_path / "other" / ckpt.WEIGHTS_FILE, tmp / ckpt.WEIGHTS_FILE)
    newest = ckpt.finalize(tmp, run, 2, keep_last=3)
    assert main(["train", "--resume", "--no-progress", "--no-plots", "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("longmoe train: error: ")]
    assert len(lines) == 1, err
    assert str(newest / ckpt.WEIGHTS_FILE) in lines[0] and "'embed.weight' is [512, 48]" in lines[0], lines[0]
