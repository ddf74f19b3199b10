"""bench/cpu_serve_users.py (longmoe serve vs llama-server, many clients at once) and its driver,
bench/http_load.py: the driver sends the requests at once, counts the tokens the responses report and keeps
every failure; the verdicts judge the range over rounds; a missing llama-server binary is refused in one
line that names the make target. The last test starts a real llama-server and longmoe serve and skips
without the binary (``make llama-server``)."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest

from bench import cpu_peer, http_load
from bench import cpu_serve_users as users


def test_missing_llama_server_is_refused_in_one_line_naming_the_make_target(tmp_path, monkeypatch):
    monkeypatch.delenv(users.BINARY_ENV, raising=False)
    not_exec = tmp_path / "llama-server"
    not_exec.write_text("")  # a file, but not executable
    for args in (["--llama-server", str(tmp_path / "absent")], ["--llama-server", str(not_exec)]):
        with pytest.raises(SystemExit) as e:
            users.main([*args, "--workdir", str(tmp_path / "work")])
        msg = str(e.value)
        assert "make llama-server" in msg and "\n" not in msg
    assert not (tmp_path / "work").exists()  # refused before building any checkpoint
    monkeypatch.setenv(users.BINARY_ENV, str(tmp_path / "from-env"))
    with pytest.raises(SystemExit, match="from-env"):
        users.find_binary(None)


def _server(replies: dict[int, tuple[int, dict]], n: int):
    """A fake ``/v1/completions``: answers only once all ``n`` requests have arrived (so a driver that
    sent them one after another would time out), each with ``replies[first prompt id]``."""
    arrived: list[dict] = []
    all_in = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        arrived.append(body)
        if len(arrived) == n:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), timeout=10)
        status, payload = replies[body["prompt"][0]]
        return httpx.Response(status, json=payload)

    return httpx.MockTransport(handle), arrived


def _ok(tokens: int, finish: str = "length") -> tuple[int, dict]:
    return 200, {"choices": [{"text": "x", "finish_reason": finish}], "usage": {"completion_tokens": tokens}}


def test_driver_sends_all_at_once_and_counts_the_tokens_the_responses_report():
    ids = [[10 + i] * 4 for i in range(5)]
    replies = {10: _ok(7), 11: _ok(3, "stop"), 12: _ok(64, "error"), 13: (503, {"error": "busy"}), 14: _ok(5)}
    transport, arrived = _server(replies, len(ids))
    s = http_load.run_clients("http://fake", ids, 64, transport=transport)
    assert len(arrived) == 5
    assert all(b["max_tokens"] == 64 and b["temperature"] == 0 and b["ignore_eos"] for b in arrived)
    assert s.tokens == 7 + 3 + 5  # reported, not requested; failed requests add nothing
    assert s.ok == 3 and len(s.failures) == 2
    assert any("finish_reason=error" in f for f in s.failures) and any(
        f.startswith("503") for f in s.failures
    )
    assert s.tok_s == s.tokens / s.wall_s > 0


def test_prompts_are_seeded_distinct_and_inside_both_vocabularies():
    a, b = users.prompts(8, 3), users.prompts(8, 4)
    assert a == users.prompts(8, 3) and a != b
    assert len({tuple(p) for p in a}) == 8 and all(len(p) == users.PROMPT_TOKENS for p in a)
    assert min(min(p) for p in a) >= 3 and max(max(p) for p in a) < 512


def _sample(c: int, tok_s: float, ok: int | None = None) -> dict:
    return {
        "clients": c,
        "wall_s": 1.0,
        "tokens": int(tok_s),
        "ok": c if ok is None else ok,
        "tok_s": tok_s,
        "failures": [],
        "server_cpu_s": tok_s / 1000,
    }


def _result(ours: dict[int, list[float]], peer: dict[int, list[float]]) -> dict:
    rounds = len(next(iter(ours.values())))
    rows = [
        {
            "load_average": {"start": [1.0], "end": [1.0]},
            "longmoe fp32 --compile": {c: _sample(c, ours[c][r]) for c in ours},
            "llama-server f32": {c: _sample(c, peer[c][r]) for c in peer},
        }
        for r in range(rounds)
    ]
    warm = {n: {c: _sample(c, 1.0) for c in ours} for n in ("longmoe fp32 --compile", "llama-server f32")}
    return {"warmup": warm, "rounds": rows}


def test_targets_are_judged_per_concurrency_on_the_range_over_rounds():
    ours = {1: [400.0, 410, 420], 8: [500.0, 520, 700], 32: [300.0, 310, 320]}
    peer = {1: [300.0, 310, 320], 8: [600.0, 600, 610], 32: [650.0, 660, 670]}
    s = users.summarize(_result(ours, peer), [1, 8, 32])
    verdicts = {g["target"].rsplit("@ ", 1)[1]: g["verdict"] for g in s["targets"]}
    assert verdicts == {
        "1 clients": "met",
        "8 clients": "not settled (range crosses the target)",
        "32 clients": "missed",
    }
    row = s["rows"]["longmoe fp32 --compile"][8]
    assert row["tok_s"] == {"median": 520.0, "min": 500.0, "max": 700.0, "n": 3}
    assert row["ok"] == row["requests"] == 24
    two = users.summarize(_result({1: [400.0, 410]}, {1: [300.0, 310]}), [1])
    assert two["targets"][0]["verdict"] == "no verdict (2 sample(s))"


def test_table_labels_single_samples_and_says_how_it_was_measured():
    s = users.summarize(_result({1: [400.0]}, {1: [300.0]}), [1])
    meta = {
        "label": "~15M",
        "threads": 2,
        "new_tokens": 64,
        "rounds": 1,
        "llama_version": "v",
        "measured_at": "now",
        "cpu_s": 1.0,
        "load_average": {"start": [3.0], "end": [4.0]},
        "note": "busy",
    }
    md = users.table(s, [1], meta)
    assert "(1 sample)" in md and "no verdict (1 sample(s))" in md
    assert "load average [3.0] at start, [4.0] at end" in md and "busy" in md and "warm-up" in md


def test_servers_are_started_with_the_compared_settings(tmp_path):
    cmd = users.llama_cmd(tmp_path / "llama-server", tmp_path / "m.gguf", 1234, 2)
    for flag, value in (("-t", "2"), ("-tb", "2"), ("--parallel", "32"), ("-fa", "on"), ("--port", "1234")):
        assert cmd[cmd.index(flag) + 1] == value
    ours = users.longmoe_cmd(tmp_path, 1234, "int8", True)
    assert ours[ours.index("--max-batch") + 1] == "32" and "--compile" in ours and "--quantize-head" in ours
    assert ours[ours.index("--max-requests-per-client") + 1] == "0"  # every client is 127.0.0.1


BINARY = os.environ.get(users.BINARY_ENV) or str(users.DEFAULT_BINARY)


@pytest.mark.slow(wall="~40 s on 2 shared cores (converts a small checkpoint, starts two servers)")
@pytest.mark.skipif(not os.access(BINARY, os.X_OK), reason="no llama-server (make llama-server)")
def test_llama_server_and_longmoe_serve_answer_concurrent_clients_with_the_asked_tokens(tmp_path):
    pytest.importorskip("transformers")
    paths = cpu_peer.build(tmp_path / "quick", "quick")
    servers = users.start_servers(
        ["llama-server f32", "longmoe fp32"], paths, users.Path(BINARY), 2, tmp_path
    )
    try:
        prov = users.llama_provenance(users.Path(BINARY), servers)
        for s in servers.values():
            sample = http_load.run_clients(s.url, users.prompts(3, 0, length=32), 8)
            assert sample.ok == 3 and sample.tokens == 24, (s.name, sample.failures, s.tail())
    finally:
        for s in servers.values():
            s.stop()
    assert prov["version"] and "-fa on" in prov["commands"]["llama-server f32"]
