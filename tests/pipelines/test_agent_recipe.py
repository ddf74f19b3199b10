"""The agent recipe's config and report: ablations are validated, the RL-over-SFT gain is computed only
at horizons where SFT is neither near 0 nor near 1, pooled success has the right standard error, and
the report files and plot are written. (The stages themselves are the tested trainers and rollouts;
``python -m longmoe.pipelines.agent --quick`` runs them all end to end.)"""

from __future__ import annotations

import json
import math

import pytest

from longmoe.pipelines.agent.config import AgentRecipeConfig
from longmoe.pipelines.agent.report import pooled, write_report


def rows(ps: list[float], n: int = 100) -> list[dict]:
    return [
        {"env": "doclookup", "horizon": h, "episodes": n, "success": p, "se": math.sqrt(p * (1 - p) / n),
         "malformed": 0.1, "validity": 0.9, "truncated": 0.0, "overflow": 0.0, "turns": 3.0,
         "tool_calls": 2.0, "tokens": 200.0, "generated": 40.0}
        for h, p in zip([1, 2, 3], ps, strict=True)
    ]  # fmt: skip


def test_config_validates_and_quick_is_small():
    with pytest.raises(ValueError, match="ablations"):
        AgentRecipeConfig(ablations=["no_such"])
    q = AgentRecipeConfig.quick()
    assert q.sft_steps < AgentRecipeConfig().sft_steps and q.rl["steps"] < AgentRecipeConfig().rl["steps"]


def test_pooled_success():
    p, se, n = pooled(rows([0.2, 0.5, 0.8]))
    assert n == 300 and p == pytest.approx(0.5) and se == pytest.approx(math.sqrt(0.25 / 300))


def test_report_gain_only_where_sft_is_mid(tmp_path):
    cfg = AgentRecipeConfig(run_dir=str(tmp_path), eval_horizons=[1, 2, 3], ablations=["no_kl"])
    evals = {
        "pretrained": rows([0.0, 0.0, 0.0]),
        "sft": rows([0.95, 0.5, 0.05]),  # only h=2 is in [0.1, 0.9]
        "sft+rl": rows([0.97, 0.65, 0.1]),
        "sft+rl:no_kl": rows([0.9, 0.6, 0.1]),
    }
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": s, "reward": 0.1 * s, "kl": 0.01, "drift_changed_mean": 0.02}) + "\n"
            for s in (1, 2)
        )  # fmt: skip
    )
    data = write_report(cfg, tmp_path, evals)
    assert [g["horizon"] for g in data["gains"]] == [2]
    assert data["gains"][0]["gain"] == pytest.approx(0.15) and data["target_met"]
    assert data["rl"]["sft+rl"]["steps"] == 2 and data["rl"]["sft+rl"]["kl_last"] == pytest.approx(0.01)
    assert data["rl"]["sft+rl"]["reward_first"] == pytest.approx(0.15)  # the mean of the (two) steps
    md = (tmp_path / "report.md").read_text()
    assert "Target met: **yes**" in md and "| sft+rl:no_kl |" in md
    assert (tmp_path / "success.png").exists() and (tmp_path / "report.json").exists()
    evals["sft+rl"] = rows([0.97, 0.55, 0.1])  # +5 points: not met
    assert not write_report(cfg, tmp_path, evals)["target_met"]


def test_evaluate_stage_scores_like_longmoe_eval_and_is_cached(tmp_path):
    """The recipe's evaluation is ``eval``'s (``run_local_eval`` + ``summarize``): one row per horizon
    in the summary's shape, episodes written, and a second call reads ``evals.json`` instead of playing."""
    import torch

    from longmoe.eval.agent.harness import EPISODES_FILE
    from longmoe.model import LongMoE
    from longmoe.pipelines.agent.run import EVALS, evaluate
    from longmoe.presets import preset
    from tests.helpers.tokenizer import tokenizer_for_tests

    torch.manual_seed(0)
    tok = tokenizer_for_tests(512)
    d = tmp_path / "model"
    LongMoE(
        preset("tiny").replace(
            vocab_size=tok.vocab_size, n_layers=2, layer_pattern="LM", attn_res_blocks=2, max_seq_len=4096
        )
    ).save_pretrained(d)
    tok.save(d / "tokenizer.json")
    cfg = AgentRecipeConfig.quick()
    cfg.eval_horizons = [1, 2]
    cfg.rl = {**cfg.rl, "max_turn_tokens": 8, "max_episode_tokens": 1024}
    rows = evaluate(cfg, tmp_path, "pretrained", d, episodes=3)
    assert [r["horizon"] for r in rows] == [1, 2] and all(r["episodes"] == 3 for r in rows)
    assert {"success", "se", "malformed", "validity", "tokens"} <= set(rows[0])
    assert (tmp_path / "evals" / "pretrained" / EPISODES_FILE).is_file()
    assert json.loads((tmp_path / EVALS).read_text())["pretrained"] == rows
    assert evaluate(cfg, tmp_path, "pretrained", tmp_path / "missing", episodes=3) == rows  # cached


def test_report_pairs_rl_and_sft_by_test_task_and_says_ablations_cannot_be_ranked(tmp_path):
    from longmoe.eval.agent.harness import EPISODES_FILE

    cfg = AgentRecipeConfig(run_dir=str(tmp_path), eval_horizons=[1, 2, 3], ablations=["no_kl"], rl_seeds=2)
    succ = {"sft": [0, 0, 1, 1], "sft+rl": [1, 0, 1, 1], "sft+rl#s1": [1, 1, 1, 0]}  # per task 0..3
    for name, ss in succ.items():
        d = tmp_path / "evals" / name
        d.mkdir(parents=True)
        eps = [
            {"env": "calculator", "horizon": 2, "seed": 10**9 + i, "success": bool(s)}
            for i, s in enumerate(ss)
        ]
        d.joinpath(EPISODES_FILE).write_text("".join(json.dumps(e) + "\n" for e in eps))
    evals = {m: rows([0.5, 0.6, 0.7]) for m in ("sft", "sft+rl", "sft+rl#s1", "sft+rl:no_kl")}
    evals["sft+rl#s1"] = rows([0.5, 0.6, 0.9])
    (tmp_path / "rl_lr.json").write_text(
        json.dumps({"lr": 5e-5, "validation_success": {"2e-05": 0.4, "5e-05": 0.45}})
    )
    data = write_report(cfg, tmp_path, evals)
    p = data["paired_rl_minus_sft"]
    g = {x["horizon"]: x for x in data["gains"]}  # RL is the mean of its two seeds
    assert g[3]["rl"] == pytest.approx(0.8) and g[3]["gain"] == pytest.approx(0.1) and not g[3]["paired"]
    assert g[2]["paired"] and g[2]["stderr"] == pytest.approx(p["se"])  # h=2 holds all the episodes
    assert data["rl_seed_success"]["seed_sd"] == pytest.approx(math.sqrt(2) * (0.7 - 0.6) / 3, rel=1e-6)
    d = [1.0, 0.5, 0.0, -0.5]  # per task: mean over the two RL seeds minus SFT
    sd = math.sqrt(sum((x - 0.25) ** 2 for x in d) / 3)
    assert p["tasks"] == 4 and p["rl_seeds"] == 2 and p["diff"] == pytest.approx(0.25)
    assert p["se"] == pytest.approx(sd / 2)
    md = (tmp_path / "report.md").read_text()
    assert "+25.0 ±" in md and "cannot be ranked" in md
    assert "5e-05: 45.0 → **5e-05**" in md and "seed-to-seed standard deviation" in md


def test_rl_lr_is_chosen_on_validation_seeds(tmp_path, monkeypatch):
    from longmoe.envs.seeds import VALIDATION_SEEDS
    from longmoe.pipelines.agent import run as agent_run

    cfg = AgentRecipeConfig(run_dir=str(tmp_path), rl_lrs=[1e-5, 1e-4])
    seen = []
    monkeypatch.setattr(agent_run, "rl", lambda c, r, t, name, ch: tmp_path / name)

    def fake_eval(c, r, name, path, episodes, validation=False):
        seen.append(validation)
        return [{"episodes": 10, "success": 0.8 if "lr0.0001" in str(path) else 0.3}]

    monkeypatch.setattr(agent_run, "evaluate", fake_eval)
    assert agent_run.choose_rl_lr(cfg, tmp_path, tmp_path / "sft") == 1e-4 and seen == [True, True]
    assert json.loads((tmp_path / "rl_lr.json").read_text())["lr"] == 1e-4
    assert agent_run.validation_offset(cfg.seed) + 1_000_000_000 in VALIDATION_SEEDS


def test_parallel_scheduler_starts_at_best_lr_so_far_and_redoes_superseded_runs():
    from longmoe.pipelines.agent.parallel import Job, Scheduler

    cfg = AgentRecipeConfig(rl_lrs=[1e-5, 1e-4, 1e-3], rl_seeds=2, ablations=["no_kl"])
    sched = Scheduler(cfg)
    first = sched.start(2, {})  # the first two candidates; nothing is scored yet
    assert [(s.lr, s.provisional) for s in first] == [(1e-5, False), (1e-4, False)]
    third = sched.start(1, {})[0]
    assert third.job == Job(1e-3, 0) and sched.start(1, {}) == []  # a chosen-lr job waits for a score
    scores = {1e-5: 0.2, 1e-4: 0.5}
    spec = sched.start(1, scores)[0]  # seed 1 at the best lr so far
    assert (spec.job, spec.lr, spec.provisional) == (Job(None, 1), 1e-4, True)
    assert sched.superseded([spec], scores) == []  # not settled: keep going
    scores[1e-3] = 0.6  # the last candidate wins: the provisional run is redone at 1e-3
    assert sched.superseded([*first, third, spec], scores) == [spec]
    redo = sched.start(2, scores)
    assert [(s.job, s.lr, s.provisional) for s in redo] == [(Job(None, 1), 1e-3, False),
                                                           (Job(None, 0, "no_kl"), 1e-3, False)]  # fmt: skip
    assert sched.pending == [] and sched.superseded(redo, scores) == []


def test_parallel_scheduler_with_one_lr_runs_every_seed_at_it():
    from longmoe.pipelines.agent.parallel import Scheduler

    cfg = AgentRecipeConfig(rl_lrs=[5e-5], rl_seeds=2, ablations=[])
    started = Scheduler(cfg).start(4, {})
    assert [(s.job.seed, s.lr, s.provisional) for s in started] == [(0, 5e-5, False), (1, 5e-5, False)]


def test_agent_recipe_rejects_nonpositive_jobs(capsys):
    from longmoe.cli import main

    assert main(["recipe", "agent", "--jobs", "0"]) == 2
    assert "argument --jobs: 0 is invalid: expected an integer >= 1" in capsys.readouterr().err
