"""``bench/rollout_long.py``'s HTTP rows and stored rows: what an HTTP row counts (the server's
``/metrics`` around the episode), that ``--merge`` keeps the rows a run does not measure with their
own provenance and refuses rows of other episodes, and one short episode through a real ``longmoe
serve`` process whose turns are prefilled from the previous prompt's snapshots."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench import rollout_long as rl
from bench.serve_proc import serve_process
from longmoe.checkpoint import save_model_dir
from longmoe.eval.agent.policies import AgentReply

CFG = {"horizon": 32, "env": rl.env_fields(32, None), "turn_tokens": rl.TURN, "quick": False}
METRICS = """# HELP longmoe_prompt_tokens_total prompt tokens submitted
# TYPE longmoe_prompt_tokens_total counter
longmoe_prompt_tokens_total{model_name="tiny"} 1200.0
longmoe_requests_total{model_name="tiny"} 3.0
longmoe_prefix_cache_tokens_reused_total{model_name="tiny"} 700.0
longmoe_prefix_cache_snapshot_bytes{model_name="tiny"} 4096.0
longmoe_request_prompt_tokens_bucket{le="1.0",model_name="tiny"} 0.0
longmoe_http_requests_total{code="200",model_name="tiny"} 9.0
"""


def _row(mode: str, wall: float = 1.0, **kw) -> dict:
    return {"mode": mode, "episodes": 1, "wall_s": wall, "tokens_per_episode": 100, "turns_per_episode": 3,
            "prefilled": 50, "wall_s_per_episode": wall, "tok_s": 100 / wall, "gen_tok_s": 1.0,
            "episode_bytes": 2**20, "fixed_bytes": 1024, "per_token_bytes": 256, **kw}  # fmt: skip


def test_scrape_reads_the_named_series_and_nothing_else():
    got = rl.scrape(METRICS)
    assert got["prompt_tokens"] == 1200 and got["requests"] == 3 and got["reused"] == 700
    assert got["snapshot_bytes"] == 4096 and got["evictions"] == 0  # absent: 0
    assert set(got) == set(rl.SERIES.values())


def test_an_http_row_counts_prefilled_as_prompt_tokens_not_restored_from_snapshots():
    replies = [AgentReply(None, {}, 100, 24), AgentReply(None, {}, 400, 24), AgentReply(None, {}, 700, 10)]
    before = dict.fromkeys(rl.SERIES.values(), 0.0) | {"prompt_tokens": 50, "snapshot_bytes": 1000}
    after = before | {"prompt_tokens": 1250, "reused": 500, "requests": 3, "snapshot_bytes": 9000}
    row = rl.http_row(SimpleNamespace(turns=3), replies, 2.0, before, after, {"cpu_s": 1.0}, 16)
    assert row["prompt_tokens"] == 1200 and row["prefilled"] == 700 and row["reused"] == 500
    assert row["tokens_per_episode"] == 710 and row["generated"] == 58 and row["tok_s"] == 355
    assert row["episode_bytes"] == 8000 and row["requests"] == 3 and row["prefix_block_size"] == 16


def test_merge_keeps_the_stored_rows_not_measured_again_each_with_provenance():
    prov = {"commit": "9a94439", "date": "2026-12-07 14:40 UTC"}
    stored = {"config": {**CFG, "episodes": [1]}, "provenance": prov,
              "rows": [_row("re-prefill", 749.0), _row("session", 148.0)]}  # fmt: skip
    new = _row("http", 200.0, prefix_block_size=16, provenance={"commit": "abc1234"})
    rows = rl.merged_rows(stored, [new], CFG)
    assert [r["mode"] for r in rows] == ["session", "re-prefill", "http"]
    assert [r["provenance"]["commit"] for r in rows] == ["9a94439", "9a94439", "abc1234"]
    assert rows[1]["wall_s"] == 749.0  # the stored measurement, not re-run
    md = rl.table(rows, CFG)
    assert "http (block 16)" in md and "9a94439, 12-07 14:40" in md


def test_merge_replaces_a_stored_row_measured_again():
    stored = {"config": CFG, "rows": [_row("session", 148.0), _row("http", 300.0, prefix_block_size=16)]}
    rows = rl.merged_rows(stored, [_row("http", 200.0, prefix_block_size=16)], CFG)
    assert [(r["mode"], r["wall_s"]) for r in rows] == [("session", 148.0), ("http", 200.0)]


@pytest.mark.parametrize("field", ["horizon", "turn_tokens", "quick"])
def test_merge_refuses_stored_rows_of_other_episodes(field):
    stored = {"config": {**CFG, field: "other"}, "rows": [_row("session")]}
    with pytest.raises(SystemExit, match=field):
        rl.merged_rows(stored, [], CFG)


def test_an_http_episode_through_longmoe_serve_is_prefilled_from_its_previous_prompts(tmp_path, tok):
    fields = rl.env_fields(2, 200)
    model_dir = save_model_dir(tmp_path / "tiny", rl.tiny_lm(tok), tok)
    with serve_process(model_dir, *rl.serve_args(16)) as sp:
        row = rl.measure_http(sp, fields, 16)
        assert sp.proc.poll() is not None  # stopped by its PID
    turns, tokens = row["turns_per_episode"], row["tokens_per_episode"]
    assert row["server"]["exit_status"] == 0 and row["requests"] == turns > 2
    assert row["prompt_tokens"] > 2 * tokens  # each turn resends the transcript ...
    assert 0 < row["prefilled"] <= tokens + 16 * turns  # ... prefilled about once: from the last block
    assert row["episode_bytes"] > 0 and row["evictions"] == 0


def test_http_rows_are_read_against_the_session_episode_of_their_own_run():
    base = {"wall_s": 60.0, "tokens_per_episode": 28602, "load_average_start": [3.0, 2.0, 1.0]}
    http = _row("http", 90.0, prefix_block_size=16, session_same_run=base, wall_vs_session=1.5)
    md = rl.table([_row("session", 148.0), http], CFG)
    session_line, http_line = (ln for ln in md.splitlines() if ln.startswith(("| session", "| http")))
    assert "| 1.5 |" in http_line and "| 1.5 |" not in session_line
    assert "engine-session episode measured in the same run" in md and "(60 s at a 1-min load of 3.0" in md
    assert "same run, before" not in rl.table([_row("session", 148.0)], CFG)
