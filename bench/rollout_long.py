"""Long-horizon rollouts: horizon-32 agent episodes (about 30K tokens each) through the engine with
and without sessions, and through ``longmoe serve`` over HTTP with tools.

The episodes are the long-horizon suite's ``doclookup`` (``envs/suites.py``: 2,000-character pages,
16 distractors, 2 corrected records, results capped at 2,400 characters), driven by the expert
(``envs/forced.py``): the model is the tiny preset with random weights, which cannot play the task, so
each turn samples up to ``TURN`` tokens that are then replaced by the expert's move in the
environment while the trajectory keeps the sampled tokens and the real observations. Modes:

- **session**: each episode keeps its cache row across turns (``serve/session.py``); a turn prefills
  only its observation;
- **re-prefill**: each turn resubmits the whole trajectory, prefilled from scratch (no prefix cache);
- **http**: one episode through a ``longmoe serve`` process (started here on 127.0.0.1 with the same
  model saved to a directory, stopped by its PID) via ``/v1/chat/completions`` with ``tools``: a
  function-calling client sending the expert's transcript so far each turn (``ExpertForcedAgent``).
  The HTTP API runs no sessions; what it keeps between turns is its prefix snapshots (docs/serve.md,
  "Multi-turn"): the recurrent state every ``--prefix-block-size`` tokens of each prompt, so a turn
  prefills from the last block boundary of the previous prompt (the client's assistant message is
  the expert's move, not what the model generated, so the finished reply's own snapshot is not hit).

Reported per row: tokens and turns per episode, prompt tokens prefilled, wall seconds in all and per
episode, trajectory tokens/s (every token of every finished trajectory / wall), generated tokens/s,
and the memory an episode holds between turns: for the engine rows its kept cache row at the
episode's final length (``CacheBudget.spec.bytes_for``: the fixed recurrent state plus the latent MLA
cache per token); for http the bytes of prefix snapshots the episode added (``/metrics``
``longmoe_prefix_cache_snapshot_bytes``). HTTP token counts are the server's (``/metrics``: prompt
tokens submitted minus those restored from snapshots), and its trajectory is the chat template's
rendering of the transcript (tool schemas and JSON tool calls), not the engine rows' ids.

``--modes`` picks the rows to measure; ``--merge`` keeps the stored rows of the others (the same
episode config), each row with its own provenance (commit, time, load average, CPU seconds, note).
The HTTP rows are also timed against an engine-session episode of their own run (the run's session
row, else one measured first; ``--no-http-baseline``: none), so HTTP's cost reads at one load.
CPU, fp32; the machine is shared with other jobs (say so with ``--note``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import httpx
import torch

from bench import common
from bench.common import RESULTS, bench_tokenizer, markdown_table, write_results
from bench.serve_proc import ServeProcess, serve_process
from longmoe.agent.rollout import RolloutConfig, collect
from longmoe.checkpoint import save_model_dir
from longmoe.envs import make_env
from longmoe.envs.forced import ExpertForced
from longmoe.envs.suites import LONG
from longmoe.eval.agent.harness import run_episode
from longmoe.eval.agent.policies import EndpointAgent, ExpertForcedAgent
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.report.provenance import load_average
from longmoe.serve.engine import Engine, EngineConfig

TURN = 24  # tokens sampled per assistant turn
CTX = 65_536
CACHE_BUDGET_MB = 8192  # every mode: nothing an episode keeps is evicted
PREFILL_CHUNK = 1024
MODES = ("session", "re-prefill", "http")
# what an HTTP row keeps of the engine-session episode measured in its run (``--no-http-baseline``: none)
SAME_RUN_KEYS = ("wall_s", "tok_s", "tokens_per_episode", "prefilled", "episode_bytes", "load_average_start")
SAME_EPISODES = ("horizon", "env", "turn_tokens", "quick")  # config keys rows must share to be merged
# /metrics series an HTTP row reads (engine.stats() through serve/api/metrics.py), by their names there
SERIES = {
    "longmoe_requests_total": "requests",
    "longmoe_prompt_tokens_total": "prompt_tokens",
    "longmoe_generated_tokens_total": "generated_tokens",
    "longmoe_prefix_cache_tokens_reused_total": "reused",
    "longmoe_prefix_cache_hits_total": "hits",
    "longmoe_prefix_cache_snapshot_bytes": "snapshot_bytes",
    "longmoe_prefix_cache_snapshots": "snapshots",
    "longmoe_prefix_cache_evictions_total": "evictions",
}
_SAMPLE = re.compile(r"^(longmoe_[a-z_]+)(?:\{[^}]*\})? (\S+)$")


def tiny_lm(tok) -> LongMoE:
    """The measured model: the tiny preset, random weights (seed 0), a ``CTX``-token window."""
    torch.manual_seed(0)
    return LongMoE(preset("tiny").replace(vocab_size=tok.vocab_size, max_seq_len=CTX)).eval()


def make_engine(tok) -> Engine:
    opts = EngineConfig(
        cache_budget_bytes=CACHE_BUDGET_MB << 20, prefill_chunk=PREFILL_CHUNK, max_batch=16,
        prefix_cache=False, max_context=CTX,
    )  # fmt: skip
    return Engine(tiny_lm(tok), tok, opts)


def env_fields(horizon: int, page_chars: int | None) -> dict:
    f = {**LONG["doclookup"], "horizon": horizon}
    if page_chars is not None:
        f["page_chars"] = page_chars
        f["max_result_chars"] = page_chars + 400
    return f


def row_provenance(cpu0: float, load0: list[float] | None, note: str, **extra) -> dict:
    """Where one row came from (a merged file holds rows of several runs)."""
    return {
        "commit": common.START_COMMIT,
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_s": round(time.process_time() - cpu0, 1),
        "load_average": {"start": load0, "end": load_average()},
        "note": note,
        **extra,
    }


def run_engine(mode: str, n: int, fields: dict, tok) -> dict:
    cfg = RolloutConfig(
        group_size=1, max_turn_tokens=TURN, max_episode_tokens=CTX - 1, sessions=mode == "session", seed=1
    )
    with make_engine(tok) as e:
        collect(
            e, lambda i: ExpertForced(make_env("doclookup", horizon=1, page_chars=200)), [0], cfg
        )  # warm-up
        t0 = time.perf_counter()
        trajs = collect(e, lambda i: ExpertForced(make_env("doclookup", **fields)), list(range(n)), cfg)
        wall = time.perf_counter() - t0
        spec = e.budget.spec
    assert all(t.success and not t.truncated for t in trajs), "an episode did not reach its end"
    lengths = [len(t.ids) for t in trajs]
    return {
        "mode": mode,
        "episodes": n,
        "wall_s": wall,
        "wall_s_per_episode": wall / n,
        "tokens": sum(lengths),
        "tokens_per_episode": statistics.mean(lengths),
        "turns_per_episode": statistics.mean(len(t.turns) for t in trajs),
        "generated": sum(t.policy_tokens for t in trajs),
        "prefilled": sum(u.prefilled for t in trajs for u in t.turns),
        "tok_s": sum(lengths) / wall,
        "gen_tok_s": sum(t.policy_tokens for t in trajs) / wall,
        "episode_bytes": spec.bytes_for(max(lengths)),
        "fixed_bytes": spec.fixed,
        "per_token_bytes": spec.per_token,
        "ids": [t.ids for t in trajs],
    }


# ------------------------------------------------------------------------------------------------ http
def scrape(text: str) -> dict[str, float]:
    """The ``SERIES`` samples of a Prometheus text page, by their short names (absent ones: 0)."""
    out = dict.fromkeys(SERIES.values(), 0.0)
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in SERIES:
            out[SERIES[m.group(1)]] += float(m.group(2))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_bytes(pid: int) -> dict[str, int]:
    """Resident and peak-resident bytes of process ``pid`` (``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status") as fh:
        text = fh.read()
    return {k: int(re.search(rf"{k}:\s+(\d+) kB", text).group(1)) * 1024 for k in ("VmRSS", "VmHWM")}


def http_row(
    episode, replies: list, wall: float, before: dict, after: dict, server: dict, block_size: int
) -> dict:
    """One HTTP row from the finished episode (``EpisodeResult``), the inner model's replies turn by
    turn, and the server's ``/metrics`` (``scrape``) before and after it."""
    d = {k: after[k] - before[k] for k in after}
    gen = sum(r.completion_tokens or 0 for r in replies)
    tokens = (replies[-1].prompt_tokens or 0) + (replies[-1].completion_tokens or 0)
    return {
        "mode": "http",
        "episodes": 1,
        "prefix_block_size": block_size,
        "wall_s": wall,
        "wall_s_per_episode": wall,
        "tokens": tokens,
        "tokens_per_episode": tokens,
        "turns_per_episode": episode.turns,
        "requests": int(d["requests"]),
        "generated": gen,
        "prompt_tokens": int(d["prompt_tokens"]),
        "prefilled": int(d["prompt_tokens"] - d["reused"]),
        "reused": int(d["reused"]),
        "prefix_hits": int(d["hits"]),
        "snapshots": int(d["snapshots"]),
        "evictions": int(d["evictions"]),
        "tok_s": tokens / wall,
        "gen_tok_s": gen / wall,
        "episode_bytes": int(d["snapshot_bytes"]),
        "server": server,
    }


def serve_args(block_size: int) -> list[str]:
    """``longmoe serve`` flags of the HTTP rows: the engine rows' context, chunk and budget, prefix
    snapshots every ``block_size`` tokens, quiet logs."""
    return ["--model-name", "tiny", "--max-context", str(CTX), "--prefill-chunk", str(PREFILL_CHUNK),
            "--cache-budget-mb", str(CACHE_BUDGET_MB), "--prefix-block-size", str(block_size),
            "--max-body-kb", "4096", "--log-level", "warning", "--access-log", "off"]  # fmt: skip


def measure_http(sp: ServeProcess, fields: dict, block_size: int) -> dict:
    """A one-turn warm-up episode, then the measured one, through the running server ``sp``; the server
    is then stopped by its PID (its exit status is in the row)."""
    warm = ExpertForcedAgent(EndpointAgent(f"{sp.url}/v1", "tiny", timeout=600))
    run_episode(warm, make_env("doclookup", horizon=1, page_chars=200), 0, max_tokens=TURN)
    agent = ExpertForcedAgent(EndpointAgent(f"{sp.url}/v1", "tiny", timeout=1800))
    before, cpu0 = scrape(httpx.get(sp.url + "/metrics").text), cpu_seconds(sp.proc.pid)
    t0 = time.perf_counter()
    r = run_episode(agent, make_env("doclookup", **fields), 0, max_tokens=TURN)
    wall = time.perf_counter() - t0
    after = scrape(httpx.get(sp.url + "/metrics").text)
    server = {"cpu_s": round(cpu_seconds(sp.proc.pid) - cpu0, 1), **memory_bytes(sp.proc.pid)}
    server["exit_status"] = sp.stop()  # SIGTERM to its PID: a clean drain exits 0
    assert r.success and not r.truncated and not r.overflow, "the HTTP episode did not reach its end"
    return http_row(r, agent.replies, wall, before, after, server, block_size)


def run_http(fields: dict, tok, threads: int, block_size: int) -> dict:
    """One episode through a ``longmoe serve`` child of the measured model (``bench/serve_proc.py``: a
    free port on 127.0.0.1, ready on ``/ready``, stopped by its PID)."""
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_model_dir(Path(tmp) / "tiny", tiny_lm(tok), tok)
        with serve_process(model_dir, *serve_args(block_size), threads=threads) as sp:
            return measure_http(sp, fields, block_size)


# ----------------------------------------------------------------------------------------------- merge
def row_key(r: dict) -> tuple:
    return r["mode"], r["episodes"], r.get("prefix_block_size")


def merged_rows(stored: dict | None, new: list[dict], cfg: dict) -> list[dict]:
    """``new`` rows plus the ``stored`` result's rows that ``new`` does not replace (same mode,
    episodes and block size), in ``MODES`` order. A stored file of another episode config is refused;
    stored rows written before rows had their own provenance get the file's."""
    if stored is None:
        return sorted(new, key=_order)
    old_cfg = stored.get("config", {})
    differ = [k for k in SAME_EPISODES if old_cfg.get(k) != cfg.get(k)]
    if differ:
        raise SystemExit(
            f"--merge: the stored result measured other episodes ({', '.join(differ)} differ); "
            "run every mode, or without --merge"
        )
    prov = stored.get("provenance") or {}
    fresh = {row_key(r) for r in new}
    kept = []
    for r in stored.get("rows", []):
        if row_key(r) in fresh:
            continue
        r.setdefault(
            "provenance",
            {"commit": prov.get("commit"), "measured_at": prov.get("date"), "command": prov.get("command"),
             "note": "written before rows carried their own provenance: the file's"},
        )  # fmt: skip
        kept.append(r)
    return sorted(kept + new, key=_order)


def _order(r: dict) -> tuple:
    return MODES.index(r["mode"]), r["episodes"], r.get("prefix_block_size") or 0


def table(rows: list[dict], cfg: dict) -> str:
    header = ["mode", "episodes", "tokens/episode", "turns/episode", "prefilled tokens", "wall s",
              "wall s/episode", "trajectory tok/s", "generated tok/s", "× re-prefill",
              "wall ÷ session (same run)", "MiB held/episode", "measured (commit, UTC)",
              "load avg (1 min)"]  # fmt: skip
    out = []
    for r in rows:
        p = r.get("provenance") or {}
        load = (p.get("load_average") or {}).get("start")
        mode = r["mode"] + (f" (block {r['prefix_block_size']})" if r["mode"] == "http" else "")
        out.append(
            [mode, r["episodes"], round(r["tokens_per_episode"]), round(r["turns_per_episode"], 1),
             r["prefilled"], r["wall_s"], r["wall_s_per_episode"], r["tok_s"], r["gen_tok_s"],
             r.get("speedup_vs_reprefill", "-"), r.get("wall_vs_session", "-"), r["episode_bytes"] / 2**20,
             f"{p.get('commit')}, {(p.get('measured_at') or '?')[5:16]}",
             "-" if load is None else f"{load[0]:.1f}"]
        )  # fmt: skip
    fields = cfg["env"]
    engine = next((r for r in rows if r["mode"] != "http"), None)
    per_row = (
        f"{engine['fixed_bytes'] / 2**10:.0f} KiB fixed (recurrent state) + {engine['per_token_bytes']} "
        "bytes/token (latent MLA cache)"
        if engine
        else "the fixed recurrent state + the latent MLA cache per token"
    )
    return markdown_table(header, out) + (
        f"\n\ndoclookup horizon {cfg['horizon']} (long suite: {fields['page_chars']}-character pages, "
        f"{fields['distractors']} distractors, {fields['corrections']} corrections), expert-driven "
        f"episodes, ≤ {cfg['turn_tokens']} sampled tokens per turn; session and re-prefill sampled "
        "identical tokens (asserted in the run that measured them). Memory held per episode: for the "
        f"engine rows its kept cache row at the final length, {per_row}; for http the prefix snapshots "
        "the episode added on the server (a recurrent state every block of tokens + the latents), whose "
        "token counts are the chat template's rendering of the transcript (tool schemas, JSON tool "
        "calls). × re-prefill: within one run only. CPU, fp32, 1 thread per process; tiny-preset "
        "shapes, random weights; measured under contention (a 2-core machine shared with other jobs; "
        "the load average at each row's start is beside it): one sample per row." + same_run_note(rows)
    )


def same_run_note(rows: list[dict]) -> str:
    """What the HTTP rows' "wall ÷ session" column divides by: the engine-session episode of their run."""
    base = next((r["session_same_run"] for r in rows if r.get("session_same_run")), None)
    if base is None:
        return ""
    load = base.get("load_average_start")
    at = "" if not load else f" at a 1-min load of {load[0]:.1f}"
    return (
        f" Wall ÷ session: an http row's wall time over an engine-session episode measured in the same "
        f"run, before the http rows ({base['wall_s']:.0f} s{at}, {base['tokens_per_episode']:.0f} tokens)."
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="horizon 8, 500-character pages (a minute or two)")
    ap.add_argument("--horizon", type=int, default=None, help="episode horizon (default 32; 8 with --quick)")
    ap.add_argument(
        "--episodes", default=None, help="concurrent episodes per engine row, e.g. 1,4 (default 1)"
    )
    ap.add_argument(
        "--page-chars", type=int, default=None, help="doclookup page size (default 2000; 500 with --quick)"
    )
    ap.add_argument("--modes", default=",".join(MODES), help=f"rows to measure (default {','.join(MODES)})")
    ap.add_argument(
        "--no-http", action="store_true", help="skip the HTTP rows (= --modes session,re-prefill)"
    )
    ap.add_argument(
        "--http-block-sizes", default="16",
        help="the server's --prefix-block-size, one HTTP row each (default 16, the server's default)",
    )  # fmt: skip
    ap.add_argument(
        "--no-http-baseline", action="store_true",
        help="do not measure a session episode beside the HTTP rows (their wall time against it, one load)",
    )  # fmt: skip
    ap.add_argument(
        "--merge", action="store_true",
        help="keep the stored rows this run does not measure (same episodes), each with its provenance",
    )  # fmt: skip
    ap.add_argument("--note", default="", help="the machine's conditions during this run (kept per row)")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite docs/benchmarks.md")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the machine is shared)")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.no_http:
        modes = [m for m in modes if m != "http"]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        ap.error(f"--modes: expected some of {', '.join(MODES)}, got {args.modes!r}")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    horizon = args.horizon or (8 if args.quick else 32)
    fields = env_fields(horizon, args.page_chars or (500 if args.quick else None))
    counts = [int(x) for x in (args.episodes or "1").split(",")]
    cfg = {"horizon": horizon, "env": fields, "turn_tokens": TURN, "quick": args.quick}
    name = "rollout_long_quick" if args.quick else "rollout_long"
    stored_path = RESULTS / f"{name}.json"
    stored = json.loads(stored_path.read_text()) if args.merge and stored_path.exists() else None
    merged_rows(stored, [], cfg)  # a stored file of other episodes is refused before measuring
    tok = bench_tokenizer(2048)
    results = []
    with torch.inference_mode():
        for n in counts:
            by_mode = {}
            for m in (m for m in MODES[:2] if m in modes):
                cpu0, load0 = time.process_time(), load_average()
                by_mode[m] = run_engine(m, n, fields, tok)
                by_mode[m]["provenance"] = row_provenance(cpu0, load0, args.note)
            if len(by_mode) == 2:
                assert by_mode["session"]["ids"] == by_mode["re-prefill"]["ids"], (
                    "modes sampled different tokens"
                )
            for m in by_mode.values():
                m.pop("ids")
                if "re-prefill" in by_mode:
                    m["speedup_vs_reprefill"] = m["tok_s"] / by_mode["re-prefill"]["tok_s"]
                results.append(m)
    if "http" in modes:
        baseline = None
        if not args.no_http_baseline:  # the session row of this run, else one measured for the comparison
            baseline = next((r for r in results if r["mode"] == "session" and r["episodes"] == 1), None)
            if baseline is None:
                load0 = load_average()
                with torch.inference_mode():
                    baseline = run_engine("session", 1, fields, tok)
                baseline.pop("ids")
                baseline["load_average_start"] = load0
        for block in (int(b) for b in args.http_block_sizes.split(",")):
            cpu0, load0 = time.process_time(), load_average()
            row = run_http(fields, tok, args.threads, block)
            row["provenance"] = row_provenance(cpu0, load0, args.note, server_cpu_s=row["server"]["cpu_s"])
            if baseline is not None:
                row["session_same_run"] = {k: baseline.get(k) for k in SAME_RUN_KEYS}
                row["wall_vs_session"] = row["wall_s"] / baseline["wall_s"]
            results.append(row)
    rows = merged_rows(stored, results, cfg)
    cfg["episodes"] = sorted({r["episodes"] for r in rows if r["mode"] != "http"})
    write_results(
        name,
        {"config": cfg, "rows": rows},
        table(rows, cfg),
        update_readme=not (args.no_readme or args.quick),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
