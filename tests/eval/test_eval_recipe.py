"""longctx_tiny recipe pieces: equal parameter counts, synthetic document lengths, config checks."""

from __future__ import annotations

import pytest

from longmoe.data import mix
from longmoe.data.tokenizer import tokenizer_for_tests
from longmoe.recipes.longctx_tiny import (
    RecipeConfig,
    model_config,
    n_params,
    train_config,
    varied_synthetic_lengths,
)


def test_patterns_have_equal_parameter_counts():
    rc = RecipeConfig()
    target = n_params(model_config(rc, "LLLM"))
    for p in ("L", "M", "LLLM"):
        cfg = model_config(rc, p, target)
        assert cfg.layer_types == [p[i % len(p)] for i in range(cfg.n_layers)]
        assert abs(n_params(cfg) - target) <= 0.002 * target, p
        assert cfg.max_seq_len == rc.window
    assert n_params(model_config(rc, "M")) != target, "without matching the sizes differ"


def test_synthetic_documents_fit_the_window():
    tok = tokenizer_for_tests(512)
    original = mix.SyntheticSource
    with varied_synthetic_lengths(0.4, 0.9):
        src = mix.make_source("synthetic", "train", 0, tok, synthetic_length=768)
        lens = [len(tok.encode(src.next().text)) + 2 for _ in range(8)]  # + bos, eos
    assert mix.SyntheticSource is original, "the patch is undone"
    assert all(lens) and max(lens) < 768 and min(lens) >= 0.35 * 768, lens
    assert len(set(lens)) > 3, "lengths vary"


def test_recipe_config_validation_and_train_config():
    with pytest.raises(ValueError, match="patterns"):
        RecipeConfig(patterns=["LX"])
    with pytest.raises(ValueError, match="synthetic_length"):
        RecipeConfig(synthetic_length=[0.5, 1.2])
    with pytest.raises(ValueError, match="unknown recipe settings"):
        RecipeConfig.load(bogus=1)
    rc = RecipeConfig.load(tokens=8192)
    tc = train_config(rc)
    (stage,) = tc.stages
    assert stage.window == rc.window and stage.tokens == 8192
    assert stage.mix == pytest.approx({"file": 1 - rc.synthetic_share, "synthetic": rc.synthetic_share})
    assert stage.synthetic_loss == rc.synthetic_loss == "answer"
    with pytest.raises(ValueError, match="synthetic_loss"):
        RecipeConfig(synthetic_loss="prompt")


def test_pattern_command_carries_the_overrides(tmp_path):
    from longmoe.recipes.longctx_tiny.__main__ import parse_args, pattern_command

    args = parse_args(["--out", str(tmp_path), "--tokens", "4096", "--eval-multiples", "1,2", "--jobs", "2"])
    cmd = pattern_command(args, "LLLM", threads=1)
    assert cmd[1:3] == ["-m", "longmoe.recipes.longctx_tiny"]
    assert cmd[cmd.index("--patterns") + 1] == "LLLM" and cmd[cmd.index("--threads") + 1] == "1"
    assert cmd[cmd.index("--tokens") + 1] == "4096" and cmd[cmd.index("--eval-multiples") + 1] == "1,2"
    assert "--window" not in cmd and "--jobs" not in cmd and "--skip-eval" not in cmd


@pytest.mark.slow
def test_recipe_end_to_end_in_parallel(tmp_path):
    """The whole recipe at toy size with --jobs 2: both patterns trained, evaluated and compared."""
    import json

    from longmoe.recipes.longctx_tiny.__main__ import main

    cfg = dict(
        RecipeConfig().__dict__,
        patterns=["L", "M"],
        reference_pattern="L",
        window=512,  # the longest task (conflict) needs ~430 tokens with this small tokenizer
        tokens=2048,
        batch_size=2,
        tokenizer_vocab=1000,
        tokenizer_chars=200_000,
        eval_tasks=["niah"],
        eval_multiples=[1, 2],
        eval_depths=1,
        eval_n=1,
        ppl_docs=1,
    )
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    out = tmp_path / "run"
    assert (
        main(["--config", str(tmp_path / "c.json"), "--out", str(out), "--jobs", "2", "--threads", "1"]) == 0
    )
    for p in ("L", "M"):
        assert (out / f"pattern-{p}" / "recipe_done.json").is_file(), (out / f"log_{p}.txt").read_text()
    assert json.loads((out / "recipe_config.json").read_text())["patterns"] == ["L", "M"]
    report = (out / "report.md").read_text()
    assert "| L |" in report and "| M |" in report
    assert main(["--config", str(tmp_path / "c.json"), "--out", str(out), "--jobs", "0"]) == 2
