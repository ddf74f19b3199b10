"""``longmoe rl``: every RLConfig field is an option with its help; a one-step run on the calculator
writes metrics, curves, a checkpoint and final/, and --resume of a finished run changes nothing."""

from __future__ import annotations

import dataclasses
import json

from longmoe.cli import main
from longmoe.rl.cli import field_help
from longmoe.rl.config import RLConfig
from tests.helpers.models import VOCAB, tiny_model
from tests.helpers.tokenizer import tokenizer_for_tests


def test_every_field_has_help(capsys):
    helps = field_help()
    assert set(helps) == {f.name for f in dataclasses.fields(RLConfig)}
    assert main(["rl", "--help"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(RLConfig):
        assert "--" + f.name.replace("_", "-") in out


def test_one_step_run_on_the_calculator(tmp_path, capsys):
    init = tmp_path / "init"
    tiny_model().save_pretrained(init)
    tokenizer_for_tests(VOCAB).save(init)
    run = tmp_path / "run"
    argv = ["rl", str(run), "--init", str(init), "--steps", "1", "--tasks-per-step", "2",
            "--group-size", "2", "--max-turn-tokens", "6", "--max-episode-tokens", "512",
            "--kl-coef", "0", "--freeze-router"]  # fmt: skip
    assert main(argv) == 0
    cfg = json.loads((run / "rl_config.json").read_text())
    assert cfg["kl_coef"] == 0.0 and cfg["freeze_router"] is True and cfg["env"] == "calculator"
    rec = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert rec["step"] == 1 and "reward" in rec
    assert (run / "rl_curves.png").exists() and (run / "final" / "model.safetensors").exists()
    assert main(["rl", str(run), "--resume"]) == 0  # already finished: nothing more to do
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
