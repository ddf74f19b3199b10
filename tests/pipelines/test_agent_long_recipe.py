"""The long-horizon agent recipe's logic: config validation, every arm and the curriculum trained
from the right start with the right RL fields (the RL calls recorded, not run), the report's
per-arm success and task-paired differences on hand numbers, and the verdict's three outcomes.
(``longmoe recipe agent-long --quick`` runs every stage end to end.)"""

from __future__ import annotations

import json
import math

import pytest

from longmoe.eval.agent.harness import EPISODES_FILE
from longmoe.pipelines.agent_long import report as long_report
from longmoe.pipelines.agent_long import run as long_run
from longmoe.pipelines.agent_long.config import ARMS, CURRICULUM, AgentLongConfig


def test_config_validates_and_quick_is_small():
    q = AgentLongConfig.quick()
    assert q.rl["steps"] <= 2 and q.rl_seeds == 1 and q.eval_horizons == [8]
    full = AgentLongConfig()
    assert full.rl["horizons"] == [8, 16] and full.rl_seeds == 3 and set(full.arms) == set(ARMS)
    with pytest.raises(ValueError, match="arms"):
        AgentLongConfig(arms=["nope"])
    with pytest.raises(ValueError, match="expert_episodes"):
        AgentLongConfig(expert_episodes=0)


def test_arms_and_curriculum_start_from_the_right_model(tmp_path, monkeypatch):
    calls = []

    def fake_rl(cfg, root, init, name, changes):
        calls.append((name, str(init), changes))
        return tmp_path / name

    monkeypatch.setattr(long_run, "rl", fake_rl)
    monkeypatch.setattr(long_run, "evaluate", lambda *a, **k: [])
    cfg = AgentLongConfig(run_dir=str(tmp_path), rl_seeds=2)
    models = long_run.run_arms(cfg, tmp_path, tmp_path / "sft", 5e-5)
    assert models == {arm: [f"{arm}#s0", f"{arm}#s1"] for arm in [*ARMS, CURRICULUM]}
    by_name = {n: (i, ch) for n, i, ch in calls}
    assert by_name["rl_lr5e-05_s0"][1] == {"lr": 5e-5, "seed": 0}  # GiGPO: the lr-choice run's name
    assert by_name["rl_outcome_lr5e-05_s1"][1]["step_adv_weight"] == 0.0
    assert by_name["rl_gigpo_nokl_lr5e-05_s0"][1]["kl_coef"] == 0.0
    short, target = by_name["rl_gigpo_curriculum_short_lr5e-05_s0"], by_name["rl_gigpo_curriculum_lr5e-05_s0"]
    assert short[0] == str(tmp_path / "sft") and short[1]["horizons"] == [2, 4] and short[1]["steps"] == 30
    assert target[0] == str(tmp_path / "rl_gigpo_curriculum_short_lr5e-05_s0") and target[1]["steps"] == 30
    assert "horizons" not in target[1]  # the targets: the recipe's RL horizons


def test_verdict_outcomes():
    d = lambda diff, se: {"diff": diff, "se": se}  # noqa: E731
    assert long_report.verdict(d(0.0, 0.01), d(0.2, 0.01), quick=False).startswith("confirmed")
    assert long_report.verdict(d(0.2, 0.01), d(0.0, 0.01), quick=False).startswith("refuted")
    assert long_report.verdict(d(0.0, 0.1), d(0.05, 0.1), quick=False).startswith("not measurable")
    assert long_report.verdict(d(0.0, 0.01), d(0.2, 0.01), quick=True).startswith("not measured")
    assert long_report.verdict(None, d(0.2, 0.01), quick=False).startswith("not measured")


def test_report_pools_seeds_and_pairs_by_task(tmp_path):
    succ = {  # per test task 0..3 at h=8
        "outcome#s0": [0, 0, 1, 0],
        "gigpo#s0": [1, 0, 1, 1],
        "gigpo#s1": [1, 1, 1, 0],
    }
    for name, ss in succ.items():
        d = tmp_path / "evals" / name
        d.mkdir(parents=True)
        eps = [
            {"env": "calculator", "horizon": 8, "seed": 10**9 + i, "success": bool(s)}
            for i, s in enumerate(ss)
        ]
        d.joinpath(EPISODES_FILE).write_text("".join(json.dumps(e) + "\n" for e in eps))
    evals = {n: [{"horizon": 8, "episodes": 4, "success": sum(s) / 4, "se": 0.1}] for n, s in succ.items()}
    (tmp_path / "evals.json").write_text(json.dumps(evals))
    cfg = AgentLongConfig(run_dir=str(tmp_path), eval_horizons=[8])
    models = {"outcome": ["outcome#s0"], "gigpo": ["gigpo#s0", "gigpo#s1"]}
    rep = long_report.write_report(
        cfg, tmp_path, models, {"calculator": {"8": [900, 1000]}}, None, quick=False
    )
    assert rep["arms"]["gigpo"]["8"][0] == pytest.approx(6 / 8) and rep["arms"]["gigpo"]["8"][2] == 8
    p = rep["paired"]["gigpo - outcome"]["8"]
    diffs = [1.0, 0.5, 0.0, 0.5]  # per task: mean over GiGPO's seeds minus outcome's
    sd = math.sqrt(sum((x - 0.5) ** 2 for x in diffs) / 3)
    assert p["diff"] == pytest.approx(0.5) and p["se"] == pytest.approx(sd / 2) and p["tasks"] == 4
    assert rep["verdict"].startswith("not measured")  # no h=16
    md = (tmp_path / "report.md").read_text()
    assert "| gigpo - outcome | +50.0 ±" in md and (tmp_path / "success_by_horizon.png").is_file()
