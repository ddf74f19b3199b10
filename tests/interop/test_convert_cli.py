"""``longmoe convert``: both directions from the command line, and one-line errors for what cannot be
converted."""

from __future__ import annotations

import pytest
import torch

from longmoe.cli import main
from longmoe.model import LongMoE
from longmoe.presets import preset
from tests.helpers.kimi import VOCAB, hf_model, save_hf

pytest.importorskip("transformers")


def test_convert_both_ways_and_report(tmp_path, capsys):
    no_schedule = {"head_dim": 16, "num_heads": 3, "short_conv_kernel_size": 4}  # no kda/full layer lists
    save_hf(hf_model(seed=1, linear_attn_config=no_schedule), tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "lm")]) == 0
    out = capsys.readouterr().out
    assert "peak RSS" in out and "5 layers (LLLLM)" in out  # transformers' default: MLA at index 4
    lm = LongMoE.from_pretrained(tmp_path / "lm")
    assert main(["convert", "--to-hf", str(tmp_path / "lm"), "--out", str(tmp_path / "back")]) == 0
    from transformers import KimiLinearForCausalLM

    back = KimiLinearForCausalLM.from_pretrained(tmp_path / "back").eval()
    x = torch.randint(0, VOCAB, (1, 20))
    with torch.no_grad():
        assert (back(x).logits - lm.eval()(x).logits).abs().max() < 1e-4


def test_convert_errors_are_one_line(tmp_path, capsys):
    LongMoE(preset("tiny")).save_pretrained(tmp_path / "tiny")
    assert main(["convert", "--to-hf", str(tmp_path / "tiny"), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("longmoe convert: error:") and "kda_gate" in err and "\n" not in err
    assert main(["convert", "--from-hf", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2
    assert "config.json" in capsys.readouterr().err
    assert main(["convert", "--from-hf", str(tmp_path), "--out", str(tmp_path / "tiny")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
