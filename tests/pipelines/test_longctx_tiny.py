"""longctx_tiny pipeline pieces: equal parameter counts, synthetic document lengths, config checks,
typed results, the report."""

from __future__ import annotations

import json

import pytest

from longmoe.config import ConfigError
from longmoe.pipelines.longctx_tiny.__main__ import main, parse_args, pattern_command
from longmoe.pipelines.longctx_tiny.checks import check, expected_checks, two_se
from longmoe.pipelines.longctx_tiny.config import CONFIG_FILE, RecipeConfig
from longmoe.pipelines.longctx_tiny.report import write_report
from longmoe.pipelines.longctx_tiny.result import AnswerLoss, EvalResult, RecipeResult, TrainResult
from longmoe.pipelines.longctx_tiny.run import model_config, n_params, train_config
from longmoe.train import mix
from longmoe.train.curriculum import Curriculum
from tests.helpers.tokenizer import tokenizer_for_tests


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
    src = mix.make_source("synthetic", "train", 0, tok, synthetic_length=768, synthetic_range=(0.4, 0.9))
    lens = [len(tok.encode(src.next().text)) + 2 for _ in range(8)]  # + bos, eos
    assert all(lens) and max(lens) < 768 and min(lens) >= 0.35 * 768, lens
    assert len(set(lens)) > 3, "lengths vary"
    assert mix.SyntheticSource.length_range == (0.4, 0.9), "the class default is untouched"


def test_short_document_stage_renders_shorter_documents():
    """The recipe's first stage packs short task documents; the second uses the full range."""
    tok = tokenizer_for_tests(512)
    rc = RecipeConfig(window=768, tokens=8 * 768 * 4, batch_size=2, short_docs_fraction=0.5)
    short, full = train_config(rc).stages
    assert (short.synthetic_length, full.synthetic_length) == (rc.short_docs_length, rc.synthetic_length)
    assert short.tokens + full.tokens == rc.tokens and short.window == full.window == 768
    cur = Curriculum([short, full], tok, seed=0)

    def doc_lengths(stage) -> list[int]:
        p = cur.packer(stage.mix, stage.window, stage.synthetic_loss, stage.synthetic_length)
        docs = [p.source.sources["synthetic"].next() for _ in range(12)]
        return [len(tok.encode(d.text)) for d in docs]

    s, f = doc_lengths(short), doc_lengths(full)
    assert max(s) <= 0.5 * 768 * 1.05 and max(f) > 0.5 * 768, (s, f)
    assert sum(s) / len(s) < 0.8 * sum(f) / len(f), (s, f)
    # without the short stage the recipe is one stage over the full range
    (only,) = train_config(RecipeConfig(short_docs_fraction=0.0)).stages
    assert only.synthetic_length == [0.2, 0.9]


def test_recipe_config_validation_and_train_config():
    with pytest.raises(ValueError, match="patterns"):
        RecipeConfig(patterns=["LX"])
    with pytest.raises(ValueError, match="synthetic_length"):
        RecipeConfig(synthetic_length=[0.5, 1.2])
    with pytest.raises(ValueError, match="short_docs_length"):
        RecipeConfig(short_docs_length=[0.3])
    with pytest.raises(ValueError, match="short_docs_fraction"):
        RecipeConfig(short_docs_fraction=1.0)
    with pytest.raises(ConfigError, match=r"config.json: unknown config field\(s\) \['bogus'\]"):
        RecipeConfig.load(bogus=1)
    rc = RecipeConfig.load(tokens=6000)
    tc = train_config(rc)
    (stage,) = tc.stages  # a short-documents stage smaller than one batch is dropped
    assert stage.window == rc.window and stage.tokens == 6000
    assert stage.mix == pytest.approx({"file": 1 - rc.synthetic_share, "synthetic": rc.synthetic_share})
    assert stage.synthetic_loss == rc.synthetic_loss == "answer"
    with pytest.raises(ValueError, match="synthetic_loss"):
        RecipeConfig(synthetic_loss="prompt")
    with pytest.raises(ValueError, match="synthetic_tasks"):
        RecipeConfig(synthetic_tasks=["niah", "sudoku"])
    (only,) = train_config(RecipeConfig(tokens=6000, synthetic_tasks=["niah", "recall"])).stages
    assert only.mix == pytest.approx(
        {"file": 1 - rc.synthetic_share, "synthetic:niah+recall": rc.synthetic_share}
    )


def test_retrieval_variant_config_loads():
    """The niah-only variant (retrieval.json) is a valid recipe whose training mix is niah documents."""
    rc = RecipeConfig.load(CONFIG_FILE.with_name("retrieval.json"))
    assert rc.synthetic_tasks == rc.eval_tasks == ["niah"]
    assert {k for s in train_config(rc).stages for k in s.mix} == {"file", "synthetic:niah"}


def test_pattern_command_carries_the_overrides(tmp_path):
    args = parse_args(["--out", str(tmp_path), "--tokens", "4096", "--eval-multiples", "1,2", "--jobs", "2"])
    cmd = pattern_command(args, "LLLM", threads=1)
    assert cmd[1:3] == ["-m", "longmoe.pipelines.longctx_tiny"]
    assert cmd[cmd.index("--patterns") + 1] == "LLLM" and cmd[cmd.index("--threads") + 1] == "1"
    assert cmd[cmd.index("--tokens") + 1] == "4096" and cmd[cmd.index("--eval-multiples") + 1] == "1,2"
    assert "--window" not in cmd and "--jobs" not in cmd and "--skip-eval" not in cmd


@pytest.mark.slow(wall="not measured; the whole recipe")
def test_recipe_end_to_end_in_parallel(tmp_path):
    """The whole recipe at toy size with --jobs 2: both patterns trained, evaluated and compared."""
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
    assert "| L |" in report and "| M |" in report and "Accuracy by variant" in report
    for plot in ("accuracy_vs_length", "answer_loss_vs_length", "ppl_by_position"):
        assert (out / "plots" / f"{plot}.png").stat().st_size > 0, plot
    assert main(["--config", str(tmp_path / "c.json"), "--out", str(out), "--jobs", "0"]) == 2


def test_expected_checks_report_small_gaps_as_noise():
    """A gap of one or two items out of dozens is not a confirmation; a large gap is."""
    assert check("c", 0.5, 0.4, True).verdict == "confirmed"
    assert check("c", 0.5, 0.4, False).verdict == "not confirmed"
    assert check("c", 0.0, 0.0, True).verdict == "not shown (tie)"
    assert check("c", 2 / 36, 1 / 36, True, noise=two_se((2 / 36, 36), (1 / 36, 36))).verdict == (
        "within noise: leans yes"
    )
    assert check("c", 0.8, 0.1, True, noise=two_se((0.8, 36), (0.1, 36))).verdict == "confirmed"

    def ev(acc: float, n: int) -> EvalResult:
        rows = [{"task": "niah", "length": L, "n": n, "all": acc} for L in (512, 1024)]
        var = [dict(r, variant="multikey") for r in rows]
        return EvalResult(by_length=rows, by_variant=var, ppl={"beyond": 1.0})

    rc = RecipeConfig(eval_tasks=["niah"], eval_multiples=[1, 2])
    assert (rc.eval_lengths, rc.beyond_lengths) == ([512, 1024], [1024])
    checks = expected_checks(rc, {"LLLM": ev(0.75, 20), "L": ev(0.25, 20), "M": ev(0.7, 20)})
    verdicts = {c.claim.split(" on ")[0] + " " + c.claim.split()[-1]: c.verdict for c in checks}
    assert checks[0].verdict == "confirmed" and "2 SE" in checks[0].evidence, checks[0]
    assert checks[2].verdict.startswith("within noise"), verdicts  # 0.75 vs 0.70 on 20 items


def _eval_result(acc: float, beyond_loss: float, preds: list[str]) -> EvalResult:
    rows = [{"task": "niah", "length": n, "n": 4, "all": acc} for n in (512, 1024)]
    nll = [AnswerLoss("niah", v, n, 4, 2.0 - acc) for n in (512, 1024) for v in ("*", "multikey")]
    ppl = {
        "inside": 3.0,
        "end_of_window": 2.9,
        "beyond": beyond_loss,
        "beyond_over_end": None,
        "window": 512,
        "buckets": [{"start": 1, "end": 512, "loss": 3.0, "ppl": 20.0}],
    }
    var = [dict(r, variant="multikey") for r in rows]
    return EvalResult(by_length=rows, by_variant=var, ppl=ppl, answer_nll=nll, predictions=preds)


def test_report_renders_the_typed_result(tmp_path):
    """report.md and results.json come from the RecipeResult alone: tables, generations, checks."""
    rc = RecipeConfig(patterns=["M", "LLLM"], eval_tasks=["niah"], eval_multiples=[1, 2])
    evals = {"M": _eval_result(0.25, 3.5, ["a", "", "a"]), "LLLM": _eval_result(0.75, 3.25, ["b"])}
    trained = {
        p: TrainResult(steps=5, tokens=4096, params=1000 + i, train_loss_last10=3.0, val_loss=None)
        for i, p in enumerate(evals)
    }
    result = RecipeResult(rc, trained, evals, expected_checks(rc, evals))
    assert result.patterns == ["M", "LLLM"] and len(result.checks) == 3
    md = write_report(result, tmp_path)
    lines = md.splitlines()
    assert lines[0] == "# longctx_tiny: layer patterns M, LLLM"
    assert "| M | 1,000 | 4,096 | 3.000 | - |" in lines and "| LLLM | 1,001 | 4,096 | 3.000 | - |" in lines
    assert "| pattern | task | 1x (512) | 2x (1024) |" in lines
    assert "| LLLM | niah | 0.75 | 0.75 |" in lines and "| M | niah | 0.25 | 0.25 |" in lines
    assert "| niah_multikey | 0.25 (8) | 0.75 (8) |" in lines
    assert "| LLLM | niah | 1.250 | 1.250 |" in lines  # answer loss, the pooled variant "*"
    assert "| M | 3.000 | 2.900 | 3.500 | - |" in lines
    assert "| M | 3 | 1 | `a` (2) |" in lines and "| LLLM | 1 | 0 | `b` (1) |" in lines
    assert "- LLLM has lower loss than M past the training window: **confirmed** (3.250 vs 3.500)" in lines
    assert md.endswith("(3.250 vs 3.500)\n") and (tmp_path / "report.md").read_text() == md
    saved = json.loads((tmp_path / "results.json").read_text())
    assert list(saved) == ["config", "trained", "checks", "accuracy", "by_variant", "ppl"]
    assert saved["config"] == rc.to_dict() and "buckets" not in saved["ppl"]["M"]
    assert saved["checks"][-1] == {
        "claim": "LLLM has lower loss than M past the training window",
        "verdict": "confirmed",
        "evidence": "3.250 vs 3.500",
        "a": 3.25,
        "b": 3.5,
    }
    assert saved["trained"]["M"] == trained["M"].to_dict()
    for plot in ("accuracy_vs_length", "answer_loss_vs_length", "ppl_by_position"):
        assert (tmp_path / "plots" / f"{plot}.png").stat().st_size > 0, plot


def test_train_result_reads_recipe_done_files():
    """recipe_done.json keeps its key order (Trainer.fit's summary, then size and losses) and reads back."""
    d = {
        "steps": 3,
        "tokens": 3072,
        "skipped_steps": 1,
        "val_loss_at_stage_end": {"full": 4.5},
        "params": 77,
        "train_loss_last10": 4.25,
        "val_loss": 4.5,
    }
    t = TrainResult.from_dict(d)
    assert t.to_dict() == d and list(t.to_dict()) == list(d)
    assert json.dumps(t.to_dict()) == json.dumps(d)
    older = TrainResult.from_dict({"steps": 3, "tokens": 3072, "params": 77})  # before skipped_steps
    assert (older.skipped_steps, older.val_loss, older.val_loss_at_stage_end) == (0, None, {})


def test_eval_tasks_are_checked_against_the_task_registry():
    with pytest.raises(ValueError, match="eval_tasks"):
        RecipeConfig(eval_tasks=["niah", "sudoku"])
    with pytest.raises(ValueError, match="eval_tasks"):
        RecipeConfig(eval_tasks=[])
    with pytest.raises(ValueError, match="eval_multiples"):
        RecipeConfig(eval_multiples=[0, 2])
    assert RecipeConfig(eval_tasks=["niah_multikey"]).eval_tasks == ["niah_multikey"]
    assert RecipeConfig().synthetic_tasks == RecipeConfig().eval_tasks == list(mix.SYNTHETIC_TASKS)
