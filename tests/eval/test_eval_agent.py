"""Agent evaluation: the episode loop and its statistics on the real environments with scripted
policies (the expert always succeeds, broken turns count as malformed, overflow ends an episode),
the endpoint client's function-calling plumbing (a mock OpenAI server playing the expert), and
``longmoe eval --tasks agent`` end to end on a tiny model, locally (RL's rollouts) and through
longmoe's server."""

from __future__ import annotations

import json
import math
import threading

import httpx
import pytest
import torch

from longmoe.agent.rollout import Trajectory, TurnRecord
from longmoe.cli import main
from longmoe.data.chat import AssistantTurn, ToolCall
from longmoe.envs import HELD_OUT_SEED_BASE, make_env
from longmoe.eval.agent.harness import (
    EpisodeResult,
    held_out_seeds,
    markdown_agent,
    run_agent_eval,
    summarize,
)
from longmoe.eval.agent.local import episode_result
from longmoe.eval.agent.policies import AgentReply, ContextOverflow, EndpointAgent, turn_from_message
from longmoe.eval.plots import plot_run
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.serve.api import create_app, serve_in_thread
from tests.helpers.tokenizer import tokenizer_for_tests

_here = threading.local()  # the environment of the episode this thread plays


def _tracked(name: str, **values):
    def make():
        _here.env = make_env(name, **values)
        return _here.env

    return make


class Scripted:
    """A policy that reads the thread's environment: ``kind`` expert | malformed | wrong | overflow."""

    name = "scripted"

    def __init__(self, kind: str = "expert") -> None:
        self.kind = kind

    def turn(self, messages, env, max_tokens):
        assert messages[0]["role"] == "system" and env is _here.env
        if self.kind == "overflow":
            raise ContextOverflow("too long")
        if self.kind == "malformed":
            turn = AssistantTurn("", (), "tool call 0: invalid JSON")
        elif self.kind == "wrong":
            turn = AssistantTurn("no idea")
        else:
            turn = env.expert()
        msg = {"role": "assistant", "content": turn.content}
        return AgentReply(turn, msg, prompt_tokens=100 + len(messages), completion_tokens=7)

    def close(self):
        pass


CELLS = {(e, h): _tracked(e, horizon=h) for e in ("calculator", "doclookup") for h in (1, 2)}


def test_expert_policy_always_succeeds(tmp_path):
    """The scripted expert through the loop: every episode succeeds, all turns valid; episodes go
    to OUT/agent_episodes.jsonl on held-out seeds; the table and the plot are written."""
    results = run_agent_eval(Scripted(), CELLS, 3, tmp_path, seed=5, concurrency=4)
    assert len(results) == 12 and all(r.success and r.reward == 1.0 for r in results)
    assert {r.seed for r in results} == set(held_out_seeds(3, 5))
    s = summarize(results, "scripted")
    assert s["overall"]["success"] == 1.0 and s["overall"]["se"] == 0.0 and s["overall"]["validity"] == 1.0
    cells = {(r["env"], r["horizon"]): r for r in s["by_horizon"]}
    assert set(cells) == set(CELLS)
    for (_env, h), row in cells.items():  # the expert makes at least `horizon` calls, then answers
        assert row["episodes"] == 3 and row["tool_calls"] >= h and row["turns"] >= h + 1
        assert row["generated"] == 7 * row["turns"]
    lines = (tmp_path / "agent_episodes.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["env"] == "calculator"
    md = markdown_agent(s)
    assert "| calculator | 1 | 3 | 1.000 | 0.000 |" in md and "| doclookup | all | 6 |" in md
    (tmp_path / "agent_summary.json").write_text(json.dumps(s))
    assert any(p.name == "agent_success_by_horizon.png" for p in plot_run(tmp_path))


@pytest.mark.parametrize(
    ("kind", "malformed", "overflow", "turns"),
    [("malformed", 1.0, 0.0, 1), ("wrong", 0.0, 0.0, 1), ("overflow", 0.0, 1.0, 0)],
)
def test_failures_are_counted(tmp_path, kind, malformed, overflow, turns):
    results = run_agent_eval(Scripted(kind), CELLS, 2, tmp_path, concurrency=2)
    s = summarize(results)["overall"]
    assert s["success"] == 0.0 and s["malformed"] == malformed and s["overflow"] == overflow
    assert s["turns"] == turns
    assert s["validity"] == (None if turns == 0 else 1.0 - malformed)


def test_standard_error_hand_case():
    rs = [EpisodeResult("e", 1, i, success=i == 0, turns=2) for i in range(4)]
    s = summarize(rs)["overall"]
    assert s["success"] == 0.25 and math.isclose(s["se"], math.sqrt(0.25 * 0.75 / 4))
    assert held_out_seeds(2) == [HELD_OUT_SEED_BASE, HELD_OUT_SEED_BASE + 1]


def test_turn_from_message():
    ok = {"content": None, "tool_calls": [{"id": "c1", "type": "function",
          "function": {"name": "calc", "arguments": '{"expression": "1 + 2"}'}}]}  # fmt: skip
    t = turn_from_message(ok)
    assert t.malformed is None and t.tool_calls == (ToolCall("calc", {"expression": "1 + 2"}, "c1"),)
    bad = {"content": "x", "tool_calls": [{"id": "c1", "function": {"name": "calc", "arguments": "{1"}}]}
    assert "not JSON" in turn_from_message(bad).malformed
    assert turn_from_message({"content": "42"}).is_final


def test_endpoint_agent_plays_the_expert_over_function_calling():
    """A mock OpenAI endpoint answering with the expert's turns as ``tool_calls`` (its own ids):
    the loop sends tools, threads the ids through the tool messages, and every episode succeeds."""
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        assert body["tools"] == _here.env.tools and body["tool_choice"] == "auto"
        ids = {
            tc["id"] for m in body["messages"] if m["role"] == "assistant" for tc in m.get("tool_calls", [])
        }
        assert all(m["tool_call_id"] in ids for m in body["messages"] if m["role"] == "tool")
        turn = _here.env.expert()
        msg = {"role": "assistant", "content": turn.content or None}
        if turn.tool_calls:
            msg["tool_calls"] = [
                tc.to_openai(f"call_srv{len(seen)}_{i}") for i, tc in enumerate(turn.tool_calls)
            ]
        usage = {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55}
        return httpx.Response(200, json={"choices": [{"index": 0, "message": msg}], "usage": usage})

    agent = EndpointAgent("http://mock/v1", "m")
    agent.http = httpx.Client(transport=httpx.MockTransport(handler))
    results = run_agent_eval(agent, CELLS, 2, "/tmp/unused-agent-eval", concurrency=1)
    assert all(r.success for r in results) and all(r.tokens == 55 for r in results)
    assert any(m["role"] == "tool" for m in seen[-1]["messages"])


# ---------------------------------------------------------------- the command, on a tiny model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    tok = tokenizer_for_tests(512)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, n_layers=4, max_seq_len=4096)
    d = tmp_path_factory.mktemp("tiny")
    LongMoE(cfg).save_pretrained(d)
    tok.save(d / "tokenizer.json")
    return d


ARGS = ["--tasks", "agent", "--envs", "calculator", "--horizons", "1,2", "--n", "2", "--max-tokens", "12"]


def _check_run(out, n=4):
    s = json.loads((out / "agent_summary.json").read_text())
    assert s["overall"]["episodes"] == n and 0.0 <= s["overall"]["success"] <= 1.0
    assert [(r["env"], r["horizon"]) for r in s["by_horizon"]] == [("calculator", 1), ("calculator", 2)]
    assert (out / "plots" / "agent_success_by_horizon.png").is_file()
    return s


def test_cli_local_model(model_dir, tmp_path, capsys):
    out = tmp_path / "local"
    assert main(["eval", "--model", str(model_dir), *ARGS, "--out", str(out), "--no-progress"]) == 0
    s = _check_run(out)
    assert s["overall"]["tokens"] > 0 and "| calculator | 1 | 2 |" in capsys.readouterr().out


def test_cli_endpoint_is_longmoe_server(make_engine, tmp_path, monkeypatch):
    """The same command through the function-calling API of longmoe's own server (key from a
    named environment variable)."""
    engine = make_engine()
    srv, th, port = serve_in_thread(create_app(engine, model_name="tiny", api_key="k"))
    monkeypatch.setenv("MY_KEY", "k")
    try:
        out = tmp_path / "http"
        argv = ["eval", "--base-url", f"http://127.0.0.1:{port}/v1", "--api-model", "tiny", "--api-key-env"]
        assert main([*argv, "MY_KEY", *ARGS, "--out", str(out), "--no-progress"]) == 0
        _check_run(out)
    finally:
        srv.should_exit = True
        th.join(timeout=10)
        engine.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--envs", "nope"], "environment 'nope' is unknown"),
        (["--horizons", "x"], "--horizons"),
        (["--env-opt", "page_chars=100"], "no selected environment has field(s) ['page_chars']"),
        (["--tasks", "agent,niah"], "runs alone"),
    ],
)
def test_cli_errors(model_dir, tmp_path, capsys, extra, message):
    assert main(["eval", "--model", str(model_dir), *ARGS, *extra, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_cli_expert_reference(model_dir, tmp_path, capsys):
    """--expert: the scripted expert through the same loop, success 1 everywhere; its episodes
    grow with the horizon (tokens counted with the --tokenizer it requires: a model dir's here)."""
    out = tmp_path / "expert"
    argv = ["eval", "--tasks", "agent", "--expert", "--envs", "doclookup", "--horizons", "1,3", "--n", "2"]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 2
    assert "--expert needs --tokenizer" in capsys.readouterr().err
    argv += ["--tokenizer", str(model_dir)]
    assert main([*argv, "--out", str(out), "--no-progress"]) == 0
    s = json.loads((out / "agent_summary.json").read_text())
    assert s["overall"]["success"] == 1.0 and s["model"] == "expert"
    short, long = s["by_horizon"]
    assert short["horizon"] == 1 and long["horizon"] == 3 and long["tokens"] > short["tokens"] > 0
    assert main([*argv, "--model", "x", "--out", str(out)]) == 2
    assert "exactly one of --model DIR, --endpoint URL or --expert" in capsys.readouterr().err


def test_subcommand_and_flat_form_give_the_same_episodes(model_dir, tmp_path):
    """`longmoe eval agent ...` (the new way) and `longmoe eval --tasks agent ...` run the same eval."""
    opts = ["--expert", "--tokenizer", str(model_dir), "--envs", "calculator", "--horizons", "1", "--n", "2"]
    opts += ["--no-progress", "--no-plots"]
    assert main(["eval", "agent", *opts, "--out", str(tmp_path / "sub")]) == 0
    assert main(["eval", "--tasks", "agent", *opts, "--out", str(tmp_path / "flat")]) == 0
    sub, flat = (json.loads((tmp_path / d / "agent_summary.json").read_text()) for d in ("sub", "flat"))
    assert sub == flat


def test_eval_subcommand_errors_are_one_line(capsys):
    assert main(["eval", "extract", "--n", "0", "--endpoint", "http://127.0.0.1:9", "--api-model", "m"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("longmoe eval: error: --n 0 is invalid")


def test_trajectory_to_episode_result():
    """A rollout's trajectory maps to the eval record: tokens = trajectory length, generated =
    policy tokens; cut by the context (no env info) is overflow, the env's turn limit truncation."""
    t = Trajectory(0, HELD_OUT_SEED_BASE, 0, 2, ids=[1] * 10, policy_mask=[False] * 6 + [True] * 4)
    t.turns = [TurnRecord(6, 10, "s")]
    t.reward, t.success, t.info = 1.0, True, {"tool_calls": 2, "tool_errors": 1, "truncated": False}
    r = episode_result("calculator", t)
    assert (r.env, r.horizon, r.success, r.tokens, r.generated, r.turns) == ("calculator", 2, True, 10, 4, 1)
    assert (r.tool_calls, r.tool_errors, r.overflow, r.truncated) == (2, 1, False, False)
    t.truncated, t.info = True, {}
    assert episode_result("c", t).overflow and not episode_result("c", t).truncated
    t.info = {"truncated": True}
    assert episode_result("c", t).truncated and not episode_result("c", t).overflow


def test_suite_long_cells_and_narrowing():
    """--suite long: doclookup, calculator and sql at horizons 8, 16, 32 with the suite's options;
    --envs / --horizons narrow it and --env-opt overrides a field; bad names are one-line errors."""
    import argparse

    from longmoe.envs import EnvConfigError
    from longmoe.eval.agent.cli import _cells

    def cells(**kw):
        ns = {"envs": None, "horizons": None, "env_opt": [], "suite": "long", **kw}
        return _cells(argparse.Namespace(**ns))

    full = cells()
    assert sorted(full) == [(e, h) for e in ("calculator", "doclookup", "sql") for h in (8, 16, 32)]
    env = full[("doclookup", 32)]()
    assert env.config.corrections == 2 and env.config.page_chars == 2000 and env.horizon == 32
    narrow = cells(envs="sql", horizons="8", env_opt=["distractors=3"])
    assert list(narrow) == [("sql", 8)] and narrow[("sql", 8)]().config.distractors == 3
    with pytest.raises(EnvConfigError, match="no environment"):
        cells(envs="nope")


def test_endpoint_plays_the_long_suite_and_sql():
    """The function-calling client on the new tasks: a mock endpoint answering with the expert's
    calls wins every long-suite sql / calculator episode at horizon 8 and a doclookup one with
    corrections (so tool results, capped pages and revisions all travel through the API)."""

    def handler(request: httpx.Request) -> httpx.Response:
        turn = _here.env.expert()
        msg = {"role": "assistant", "content": turn.content or None}
        if turn.tool_calls:
            msg["tool_calls"] = [tc.to_openai(f"c{i}") for i, tc in enumerate(turn.tool_calls)]
        return httpx.Response(200, json={"choices": [{"index": 0, "message": msg}]})

    from longmoe.envs.suites import suite_cells

    cells = {k: _tracked(k[0], **v) for k, v in suite_cells("long", horizons=[8]).items()}
    agent = EndpointAgent("http://mock/v1", "m")
    agent.http = httpx.Client(transport=httpx.MockTransport(handler))
    results = run_agent_eval(agent, cells, 2, "/tmp/unused-agent-eval-long", concurrency=1)
    assert len(results) == 6 and all(r.success for r in results)
    assert {r.env for r in results} == {"sql", "calculator", "doclookup"}
