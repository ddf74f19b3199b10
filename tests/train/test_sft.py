"""``longmoe sft``: the loss mask on hand-built trajectories, demonstrations from the experts,
training with drift logging, resume equal to an uninterrupted run, the frozen router, the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from longmoe import checkpoint as ckpt
from longmoe.cli import main
from longmoe.config import IGNORE_INDEX, ConfigError
from longmoe.data.chat import render_messages
from longmoe.envs import HELD_OUT_SEED_BASE
from longmoe.model import LongMoE
from longmoe.runlog import read_metrics
from longmoe.train.config import TrainConfig
from longmoe.train.sft import SFTConfig, SFTData, SFTTrainer, chat_window, sft_stage
from tests.helpers.train import small_model_config

CALL = {"name": "calc", "arguments": {"expression": "2+3"}}
TINY_ENVS = {"doclookup": {"page_chars": 60, "pages_per_doc": 2, "distractors": 1}}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tok):
    """A (randomly initialised) small model directory standing in for a pretrained run."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("pre") / "model"
    return ckpt.save_model_dir(path, LongMoE(small_model_config()), tok)


def sft_configs(pretrained, steps=3, batch_size=1, **train):
    """Small on purpose (the machine is shared): calculator demonstrations of one step, short replay."""
    sft = SFTConfig(
        init_from=str(pretrained), envs={"calculator": 1.0}, horizons=[1], env_options=TINY_ENVS, max_len=256,
        drift_every=2, drift_probe=1,
    )  # fmt: skip
    base = dict(
        stages=[sft_stage(steps, batch_size, 0.25, 32, {"file": 1.0})], lr=1e-3, warmup_steps=1,
        ckpt_every=2, eval_every=0, val_windows=1,
    )  # fmt: skip
    base.update(train)
    return sft, TrainConfig(**base)


def test_chat_window_trains_on_assistant_tokens_only(tok) -> None:
    """A hand-built trajectory: targets are exactly the assistant bodies (and their <|end|>)."""
    msgs = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": CALL}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "5"},
    ]  # fmt: skip
    w = chat_window(tok, msgs, 10_000)
    assert w.input_ids[0] == tok.bos_id and w.seg_lens == [len(w.input_ids)]
    assert w.input_ids[1:] == tok.encode(render_messages(msgs, add_generation_prompt=False))
    targets = [t for t in w.labels if t != IGNORE_INDEX]
    text = tok.decode(targets, skip_special_tokens=False)
    assert text == '{"name": "calc", "arguments": {"expression": "2+3"}}<|end|>5<|end|>'.replace(
        '{"name"', '<|tool_call|>{"name"'
    )
    for j, t in enumerate(w.labels):  # each target is the next input id
        assert t == IGNORE_INDEX or t == w.input_ids[j + 1]
    cut = chat_window(tok, msgs, 12)
    assert len(cut.input_ids) == 12 and len(cut.labels) == 12


def test_demonstrations_are_expert_wins_on_training_seeds(pretrained, tok) -> None:
    sft, tcfg = sft_configs(pretrained, batch_size=2)
    sft.envs, sft.horizons = {"doclookup": 1.0, "calculator": 1.0}, [1, 2]
    data = SFTData(tcfg.stages, tok, 0, None, sft)
    eps = [data.demonstration(i) for i in range(24)]
    assert all(e.reward == 1.0 for e in eps)
    assert {e.info["env"] for e in eps} == {"doclookup", "calculator"}
    assert {e.info["horizon"] for e in eps} == {1, 2}
    assert all(e.info["seed"] < HELD_OUT_SEED_BASE for e in eps)
    assert all(data.demonstration(i, held_out=True).info["seed"] >= HELD_OUT_SEED_BASE for i in range(3))
    b = data.next_batch()
    assert int(b.cu_seqlens[-1]) == b.input_ids.shape[1] and b.n_demos == 2
    assert len(b.cu_seqlens) - 1 >= 3  # two demonstrations + at least one replay segment


def test_sft_config_validation(pretrained) -> None:
    with pytest.raises(ConfigError, match="envs"):
        SFTConfig(init_from=str(pretrained), envs={"shell": 1.0})
    with pytest.raises(ConfigError, match="horizons"):
        SFTConfig(init_from=str(pretrained), horizons=[0])
    with pytest.raises(ValueError, match="page_chars"):
        SFTConfig(init_from=str(pretrained), env_options={"doclookup": {"page_chars": 1}})


def test_sft_trains_logs_drift_and_resumes_exactly(tmp_path, pretrained) -> None:
    """A 3-step run logs losses and drift; stopping at step 2 and resuming gives the same log."""
    sft, tcfg = sft_configs(pretrained)
    a = SFTTrainer(tmp_path / "a", sft, tcfg, progress=False)
    start = {k: v.clone() for k, v in a.model.state_dict().items()}
    pre = LongMoE.from_pretrained(pretrained).state_dict()
    assert all(torch.equal(start[k], pre[k]) for k in pre)  # starts from the pretrained weights
    a.fit()
    full = read_metrics(tmp_path / "a")
    assert [r["step"] for r in full if "loss" in r] == [1, 2, 3]
    drift = [r for r in full if "drift_changed" in r]
    assert [r["step"] for r in drift] == [1, 2]
    assert all(0.0 <= x <= 1.0 for r in drift for x in r["drift_changed"] + r["drift_load_tv"])
    assert (tmp_path / "a" / "drift_reference.pt").is_file()

    b = SFTTrainer(tmp_path / "b", sft, tcfg, progress=False, max_steps=2)
    b.fit()
    b = SFTTrainer(tmp_path / "b", resume=True, progress=False)
    assert b.step == 2
    b.fit()
    resumed = read_metrics(tmp_path / "b")
    keys = ("step", "loss", "drift_changed", "drift_load_tv")
    assert [{k: r.get(k) for k in keys} for r in resumed] == [{k: r.get(k) for k in keys} for r in full]


def test_sft_with_frozen_router_keeps_routers_and_bias(tmp_path, pretrained) -> None:
    sft, tcfg = sft_configs(pretrained, steps=1, freeze_router=True, ckpt_every=0)
    sft.drift_every = 0
    t = SFTTrainer(tmp_path / "f", sft, tcfg, progress=False)
    before = [(m.router.weight.clone(), m.bias.clone()) for m in t.model.moe_layers()]
    t.fit()
    for (w, b), m in zip(before, t.model.moe_layers()):
        assert torch.equal(w, m.router.weight) and torch.equal(b, m.bias)


def test_sft_cli_help_explains_every_option(capsys) -> None:
    assert main(["sft", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--init-from", "--envs", "--horizons", "--env-option", "--max-len", "--steps", "--batch-size",
        "--replay-fraction", "--replay-window", "--lr", "--freeze-router", "--drift-every", "--resume",
        "--run-dir", "--bf16", "--max-steps",
    ):  # fmt: skip
        assert flag in out
    assert main(["--help"]) == 0 and "sft" in capsys.readouterr().out


def test_sft_cli_runs_and_errors(tmp_path, pretrained, capsys) -> None:
    run = tmp_path / "cli"
    args = [
        "sft", "--init-from", str(pretrained), "--run-dir", str(run), "--envs", "calculator",
        "--horizons", "1", "--steps", "1", "--batch-size", "1", "--replay-window", "32", "--max-len", "200",
        "--drift-every", "1", "--no-progress",
    ]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 1
    assert (run / "drift.png").is_file() and (run / "final" / "model.safetensors").is_file()
    assert main(["sft", "--run-dir", str(tmp_path / "x"), "--no-progress"]) == 2
    assert "--init-from is required" in capsys.readouterr().err
    assert main(["sft", "--resume", "--run-dir", str(tmp_path / "none")]) == 2
    bad = [
        "sft",
        "--init-from",
        str(pretrained),
        "--run-dir",
        str(tmp_path / "y"),
        "--env-option",
        "doclookup.pages",
    ]
    assert main(bad) == 2 and "ENV.FIELD=VALUE" in capsys.readouterr().err
