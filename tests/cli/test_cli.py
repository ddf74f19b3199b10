"""The CLI entry point: `longmoe --help`, `longmoe version`, and `python -m longmoe` are one CLI."""

import importlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

import longmoe.cli
from longmoe import __version__
from longmoe.cli import COMMANDS, main
from longmoe.data.stages import CurriculumStage
from longmoe.errors import UserError
from longmoe.presets import preset
from longmoe.train.config import TrainConfig
from longmoe.train.pretrain import Trainer
from tests.helpers.tokenizer import tokenizer_for_tests


def test_version_command(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == f"longmoe {__version__}"


def test_help_lists_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "version" in out and "<command>" in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_module_imports_and_has_its_help(command, capsys):
    """No command is hidden when its module fails to import: each one builds its parser and --help works."""
    module = importlib.import_module(COMMANDS[command][0])
    assert callable(module.add_arguments) and callable(module.run)
    assert main([command, "--help"]) == 0
    assert f"longmoe {command}" in capsys.readouterr().out


def test_python_dash_m_is_the_same_cli():
    out = subprocess.run(
        [sys.executable, "-m", "longmoe", "version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"longmoe {__version__}"


def test_unknown_command_fails():
    r = subprocess.run([sys.executable, "-m", "longmoe", "no-such-command"], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr


# ---------------------------------------------------------------------------------- error style
# Every user error, whatever the command, is one line `longmoe <cmd>: error: <message>` on stderr that
# names the file / flag / field to fix, with exit status 2 and no traceback.


def _tiny_run(root: Path) -> Path:
    """A real training run (one optimizer step, one checkpoint) of a very small model."""
    cfg = preset("tiny").replace(
        vocab_size=512, d_model=32, n_layers=2, layer_pattern="LM", attn_res_blocks=1
    )
    tcfg = TrainConfig(
        stages=[CurriculumStage("a", window=32, tokens=32 * 2 * 3, batch_size=2)],
        ckpt_every=1, eval_every=0, val_windows=1,
    )  # fmt: skip
    run = root / "run"
    Trainer(run, cfg, tcfg, tokenizer_for_tests(512), progress=False, max_steps=1).fit()
    return run


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A directory of broken inputs, one per case below (plus a real run to resume into)."""
    d = tmp_path_factory.mktemp("hostile")
    (d / "garbage.bin").write_bytes(random.Random(0).randbytes(20_000))
    (d / "garbage.json").write_bytes(random.Random(1).randbytes(2_000))
    (d / "list.json").write_text("[1, 2, 3]")
    (d / "truncated.json").write_text('{"d_model": 12')
    (d / "wrongtype.json").write_text(json.dumps({"d_model": "512"}))
    (d / "wrongtype-nested.json").write_text(json.dumps({"ffn": {"top_k": "two"}}))
    (d / "unknown-field.json").write_text(json.dumps({"d_modle": 64}))
    stage = {"name": "a", "window": 64, "tokens": 1024}
    (d / "train-unknown-stage-field.json").write_text(json.dumps({"stages": [{**stage, "windw": 3}]}))
    (d / "train-stage-wrong-type.json").write_text(json.dumps({"stages": [{**stage, "window": "64"}]}))
    (d / "train-stages-not-list.json").write_text(json.dumps({"stages": 5}))
    (d / "train-bad-value.json").write_text(json.dumps({"stages": [stage], "lr": -1}))
    HFTokenizer(models.BPE()).save(str(d / "foreign-tokenizer.json"))  # valid, but no longmoe specials
    (d / "corrupt.parquet").write_bytes(b"PAR1" + random.Random(2).randbytes(500) + b"PAR1")
    (d / "empty.parquet").write_bytes(b"")
    run = _tiny_run(d)
    # the same run with another model config.json: its checkpoint now comes from another config
    shutil.copytree(run, d / "other-config-run")
    other = json.loads((run / "config.json").read_text())
    other["d_model"], other["n_layers"] = 48, 4
    (d / "other-config-run" / "config.json").write_text(json.dumps(other))
    (d / "not-a-run").mkdir()
    # model directories with one broken file each
    for name, file, text in [
        ("model-bad-tokenizer", "tokenizer.json", "\x00\x01 not json"),
        ("model-foreign-tokenizer", "tokenizer.json", (d / "foreign-tokenizer.json").read_text()),
        ("model-wrongtype-config", "config.json", json.dumps({**other, "n_layers": "4"})),
        ("model-bad-config", "config.json", "{"),
    ]:
        shutil.copytree(run / "final", d / name)
        (d / name / file).write_text(text)
    return d


NO_CUDA = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
T = "train --run-dir {d}/new --no-progress --no-plots"  # a new run (never reached: each case fails first)
CLI_ERRORS = [
    # (argv with {d} = the hostile directory, the substrings the one error line must contain)
    ("inspect --config {d}/truncated.json", ["truncated.json", "not valid JSON"]),
    ("inspect --config {d}/garbage.json", ["garbage.json", "not valid JSON"]),
    ("inspect --config {d}/list.json", ["list.json", "JSON object"]),
    ("inspect --config {d}/wrongtype.json", ["wrongtype.json", "d_model", "'512'"]),
    ("inspect --config {d}/wrongtype-nested.json", ["wrongtype-nested.json", "top_k", "'two'"]),
    ("inspect --config {d}/unknown-field.json", ["unknown-field.json", "d_modle"]),
    ("inspect --config {d}/missing.json", ["missing.json"]),
    ("inspect --preset nonesuch", ["nonesuch"]),
    (T + " --config {d}/wrongtype.json", ["wrongtype.json", "d_model"]),
    (T + " --config {d}/truncated.json", ["truncated.json", "not valid JSON"]),
    (T + " --train-config {d}/truncated.json", ["truncated.json", "not valid JSON"]),
    (T + " --train-config {d}/garbage.json", ["garbage.json", "not valid JSON"]),
    (T + " --train-config {d}/list.json", ["list.json", "JSON object"]),
    (T + " --train-config {d}/train-unknown-stage-field.json", ["train-unknown-stage-field.json", "windw"]),
    (T + " --train-config {d}/train-stage-wrong-type.json", ["train-stage-wrong-type.json", "window"]),
    (T + " --train-config {d}/train-stages-not-list.json", ["train-stages-not-list.json", "stages"]),
    (T + " --train-config {d}/train-bad-value.json", ["train-bad-value.json", "lr"]),
    (T + " --tokenizer {d}/garbage.json", ["garbage.json", "not a tokenizer"]),
    (T + " --tokenizer {d}/list.json", ["list.json", "not a tokenizer"]),
    (T + " --tokenizer {d}/foreign-tokenizer.json", ["foreign-tokenizer.json", "special token"]),
    (T + " --tokenizer {d}/missing.json", ["missing.json", "not found"]),
    (T + " --data {d}/garbage.bin", ["garbage.bin", "binary", "% of its bytes"]),
    (T + " --data {d}/corrupt.parquet", ["corrupt.parquet", "Parquet"]),
    (T + " --data {d}/empty.parquet", ["empty.parquet", "Parquet"]),
    (T + " --preset flagship", ["GiB", "available"]),
    ("train --resume --no-progress --run-dir {d}/no-such-run", ["no-such-run", "does not exist"]),
    ("train --resume --no-progress --run-dir {d}/not-a-run", ["not-a-run", "config.json"]),
    ("train --resume --no-progress --run-dir {d}/other-config-run", ["other config", "d_model", "n_layers"]),
    ("train --resume --no-progress --run-dir {d}/run --preset small", ["--preset small", "d_model"]),
    (T + " --max-steps 0", ["--max-steps", "0"]),
    (T + " --max-steps -3", ["--max-steps", "-3"]),
    (T + " --scale 0", ["--scale", "0"]),
    (T + " --scale -1.5", ["--scale", "-1.5"]),
    (T + " --scale nan", ["--scale", "nan"]),
    ("serve --model {d}/run --port 65536", ["--port", "65536", "0-65535"]),
    ("serve --model {d}/run --port -1", ["--port", "-1"]),
    ("serve --model {d}/run --port http", ["--port", "http"]),
    (f"serve --model {{d}}/run --device {NO_CUDA}", ["--device", NO_CUDA]),
    (f"generate --model {{d}}/run --device {NO_CUDA} hi", ["--device", NO_CUDA]),
    (f"chat --model {{d}}/run --device {NO_CUDA}", ["--device", NO_CUDA]),
    (f"eval --model {{d}}/run --device {NO_CUDA}", ["--device", NO_CUDA]),
    ("generate --model {d}/no-such-model hi", ["no-such-model"]),
    (
        "generate --model {d}/model-bad-tokenizer hi",
        ["model-bad-tokenizer/tokenizer.json", "not a tokenizer"],
    ),
    ("chat --model {d}/model-foreign-tokenizer", ["model-foreign-tokenizer/tokenizer.json", "special token"]),
    ("generate --model {d}/model-wrongtype-config hi", ["model-wrongtype-config/config.json", "n_layers"]),
    ("serve --model {d}/model-bad-config", ["model-bad-config/config.json", "not valid JSON"]),
    ("eval --model {d}/model-bad-tokenizer --lengths 1k", ["model-bad-tokenizer/tokenizer.json"]),
    ("plot {d}/not-a-run", ["metrics.jsonl"]),
]


@pytest.mark.parametrize(("argv", "needles"), CLI_ERRORS, ids=[c[0].replace(T, "train") for c in CLI_ERRORS])
def test_user_errors_are_one_line_naming_the_culprit(hostile, capsys, argv, needles):
    args = [a.format(d=hostile) for a in argv.split()]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"longmoe {args[0]}: error: ")]
    assert len(lines) == 1, err
    for n in needles:
        assert n.format(d=hostile) in lines[0], (n, lines[0])
    assert not (hostile / "new").exists(), "a failed command must not leave a half-made run behind"


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only user errors become one line: anything else is a bug and must stay visible."""

    def boom(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(longmoe.cli, "run", boom)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["version"])


def test_ctrl_c_exits_130_quietly(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(longmoe.cli, "run", interrupted)
    assert main(["version"]) == 130
    assert "Traceback" not in capsys.readouterr().err


def test_closed_stdout_is_quiet():
    """`longmoe inspect | head -1`: the reader goes away early; no BrokenPipeError traceback."""
    p = subprocess.Popen(
        [sys.executable, "-m", "longmoe", "inspect", "--preset", "flagship"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()  # closed before the child writes: its first write meets a broken pipe
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 1
    assert err == "", err


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (UserError("bad value\n  in field x\n"), "bad value in field x"),
        (FileNotFoundError("data file not found: a.txt"), "data file not found: a.txt"),
        (PermissionError(13, "Permission denied", "runs/x"), "[Errno 13] Permission denied: 'runs/x'"),
        (UserError(""), "UserError"),
    ],
)
def test_user_error_messages_become_exactly_one_line(monkeypatch, capsys, exc, line):
    def fails(args):
        raise exc

    monkeypatch.setattr(longmoe.cli, "run", fails)
    assert main(["version"]) == 2
    assert capsys.readouterr().err == f"longmoe version: error: {line}\n"
