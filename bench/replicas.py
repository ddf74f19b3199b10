"""Replicas behind haproxy (deploy/haproxy/haproxy.cfg): what session affinity buys a multi-turn chat.

16 users chat 10 turns each, all at once, through haproxy in front of 1, 2 and 3 ``longmoe serve``
replicas (1 thread each, prefix cache on), once with ``X-Session-Id`` (consistent hashing: a user's
turns land on one replica, whose prefix snapshots hold the conversation so far) and once without
(round-robin). Main figure: the **cached-token share**, prompt tokens served from a snapshot over all
prompt tokens (``usage.prompt_tokens_details.cached_tokens``). TTFT p50/p95 are measured by the
client on a shared 2-core machine under contention (every replica, haproxy and the 16 clients share
the cores), so they say little beyond their order. Then a replica is killed (SIGKILL) mid-load with
affinity on: each user's requests after the kill are counted by outcome (ok, a retryable 502/503 or
connection error; a client retries once), split by whether the user was on the killed replica.

Model: the ``tiny`` preset with random weights (fp32, CPU) and the benchmark tokenizer; the replies
are noise, which is fine: what is measured is where the prompt tokens are served from.

    python -m bench.replicas [--users 16 --turns 10 --replicas 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.common import bench_tokenizer, markdown_table, write_results
from longmoe.model import LongMoE
from longmoe.presets import preset

ROOT = Path(__file__).resolve().parent.parent
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
MAX_TOKENS = 12
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "kilo", "lima")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def save_model(d: Path) -> Path:
    cfg = preset("tiny").replace(vocab_size=512, max_seq_len=2048, tie_embeddings=False)
    LongMoE(cfg).eval().save_pretrained(d)
    bench_tokenizer(512).save(d)
    return d


def start_replica(model: Path, port: int, log: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "longmoe",
        "serve",
        "--model",
        str(model),
        "--port",
        str(port),
        "--model-name",
        "m",
        "--max-batch",
        "16",
        "--max-requests-per-client",
        "0",
        "--drain-timeout",
        "5",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def haproxy_config(port: int, replicas: list[int]) -> str:
    """deploy/haproxy/haproxy.cfg with its bind port and server lines swapped for these replicas."""
    text = HAPROXY_CFG.read_text()
    text = re.sub(r"bind 127\.0\.0\.1:\d+", f"bind 127.0.0.1:{port}", text)
    text = re.sub(r"(    server r\d 127\.0\.0\.1:\d+\n)+", "", text)
    servers = "".join(f"    server r{i + 1} 127.0.0.1:{p}\n" for i, p in enumerate(replicas))
    return text.rstrip("\n") + "\n" + servers


def wait_ready(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


class Cluster:
    def __init__(self, model: Path, n: int, tmp: Path) -> None:
        self.ports = [free_port() for _ in range(n)]
        self.procs = [start_replica(model, p, tmp / f"r{i}.log") for i, p in enumerate(self.ports)]
        for p in self.ports:
            wait_ready(f"http://127.0.0.1:{p}")
        self.lb_port = free_port()
        cfg = tmp / "haproxy.cfg"
        cfg.write_text(haproxy_config(self.lb_port, self.ports))
        self.lb = subprocess.Popen(
            ["haproxy", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.url = f"http://127.0.0.1:{self.lb_port}"
        time.sleep(2.5)  # haproxy's first checks (rise 2, inter 1s) mark the replicas up
        wait_ready(self.url)

    def close(self) -> None:
        for p in [self.lb, *self.procs]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [self.lb, *self.procs]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def one_turn(client: httpx.Client, url: str, messages: list, session: str | None) -> dict:
    headers = {"X-Session-Id": session} if session else {}
    body = {"model": "m", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    ttft, text, usage, status, server = None, [], None, None, None
    try:
        with client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=300
        ) as r:
            status, server = r.status_code, r.headers.get("x-served-by")
            if status != 200:
                r.read()
                return {"status": status, "server": server}
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                ev = json.loads(line[6:])
                if "error" in ev:
                    return {"status": ev["error"].get("code") or "error", "server": server}
                if ev.get("usage"):
                    usage = ev["usage"]
                for ch in ev.get("choices", []):
                    if ch["delta"].get("content"):
                        ttft = ttft if ttft is not None else time.perf_counter() - t0
                        text.append(ch["delta"]["content"])
    except httpx.HTTPError as e:
        return {"status": type(e).__name__, "server": server}
    if usage is None:
        return {"status": "cut", "server": server}
    return {
        "status": 200,
        "server": server,
        "ttft": ttft,
        "text": "".join(text),
        "prompt": usage["prompt_tokens"],
        "cached": usage["prompt_tokens_details"]["cached_tokens"],
    }


def user_messages(rng: random.Random, n_words: int = 60) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def chat_load(url: str, users: int, turns: int, affinity: bool, seed: int = 0,
              on_turn=None) -> list[list[dict]]:  # fmt: skip
    """Each user's turns (a list of result dicts), users in parallel; a failed turn is retried once."""
    out: list[list[dict]] = [[] for _ in range(users)]

    def user(u: int) -> None:
        rng = random.Random(seed * 1000 + u)
        session = f"user-{seed}-{u}" if affinity else None
        msgs: list[dict] = []
        with httpx.Client() as client:
            for t in range(turns):
                if on_turn is not None:
                    on_turn(u, t)
                msgs.append({"role": "user", "content": user_messages(rng, 60 if t == 0 else 12)})
                res = one_turn(client, url, msgs, session)
                if res["status"] != 200:  # a retryable failure: the client tries once more
                    res = {**one_turn(client, url, msgs, session), "first_failure": res["status"]}
                out[u].append({**res, "ended": time.monotonic()})
                msgs.append({"role": "assistant", "content": res.get("text", "")})

    threads = [threading.Thread(target=user, args=(u,)) for u in range(users)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return out


def summarize(results: list[list[dict]]) -> dict:
    ok = [r for rs in results for r in rs if r["status"] == 200]
    prompt, cached = sum(r["prompt"] for r in ok), sum(r["cached"] for r in ok)
    ttft = sorted(r["ttft"] for r in ok if r["ttft"] is not None)
    q = statistics.quantiles(ttft, n=20) if len(ttft) >= 2 else [float("nan")] * 19
    return {
        "requests": sum(len(rs) for rs in results),
        "ok": len(ok),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": cached / prompt if prompt else 0.0,
        "ttft_p50_s": statistics.median(ttft) if ttft else float("nan"),
        "ttft_p95_s": q[18],
    }


def kill_test(model: Path, tmp: Path, users: int, turns: int) -> dict:
    """2 replicas, affinity on; replica 1 is SIGKILLed when the load reaches half its turns."""
    c = Cluster(model, 2, tmp)
    killed = threading.Event()
    kill_at = [float("inf")]

    def on_turn(u: int, t: int) -> None:
        if t == turns // 2 and not killed.is_set():
            killed.set()
            kill_at[0] = time.monotonic()
            c.procs[0].kill()

    try:
        res = chat_load(c.url, users, turns, affinity=True, seed=7, on_turn=on_turn)
    finally:
        c.close()
    # a user's replica: where its first turn was served (before the kill)
    rows = {"on_killed": {"users": 0, "ok": 0, "retried_ok": 0, "failed": 0},
            "on_survivor": {"users": 0, "ok": 0, "retried_ok": 0, "failed": 0}}  # fmt: skip
    first_failures: dict[str, int] = {}
    for rs in res:
        side = "on_killed" if rs[0].get("server") == "r1" else "on_survivor"
        rows[side]["users"] += 1
        for r in (r for r in rs if r["ended"] >= kill_at[0]):  # the turns in flight at the kill too
            if r["status"] == 200 and "first_failure" in r:
                rows[side]["retried_ok"] += 1
                first_failures[str(r["first_failure"])] = first_failures.get(str(r["first_failure"]), 0) + 1
            elif r["status"] == 200:
                rows[side]["ok"] += 1
            else:
                rows[side]["failed"] += 1
    return {**rows, "first_failures": first_failures}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=16, help="concurrent chat users (16)")
    ap.add_argument("--turns", type=int, default=10, help="turns per user (10)")
    ap.add_argument("--replicas", default="1,2,3", help="replica counts to measure (1,2,3)")
    args = ap.parse_args()
    if shutil.which("haproxy") is None:
        sys.exit("bench.replicas needs haproxy (apt-get install haproxy)")
    t0 = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        model = save_model(tmp / "model")
        for n in [int(x) for x in args.replicas.split(",")]:
            for affinity in (True, False):
                c = Cluster(model, n, tmp)
                try:
                    res = chat_load(c.url, args.users, args.turns, affinity)
                finally:
                    c.close()
                s = {"replicas": n, "routing": "affinity" if affinity else "round-robin", **summarize(res)}
                print(json.dumps(s), flush=True)
                runs.append(s)
        kill = kill_test(model, tmp, args.users, args.turns)
        print(json.dumps(kill), flush=True)
    rows = [[r["replicas"], r["routing"], f"{100 * r['cached_share']:.1f}%", f"{r['ok']}/{r['requests']}",
             r["ttft_p50_s"], r["ttft_p95_s"]] for r in runs]  # fmt: skip
    table = markdown_table(
        ["replicas", "routing", "cached-token share", "ok", "TTFT p50 (s)*", "TTFT p95 (s)*"], rows
    )
    k = kill
    table += (
        f"\n\n{args.users} users x {args.turns} turns, one run per row (single samples), haproxy "
        f"(deploy/haproxy/haproxy.cfg), replicas at 1 thread each, tiny-preset random-weight model. "
        f"*TTFT measured by the clients under contention: all replicas, haproxy and {args.users} clients "
        f"on a shared 2-core machine. Replica killed (SIGKILL) at turn {args.turns // 2} of 2 replicas with "
        f"affinity; turns that ended after the kill (those in flight at the kill included): "
        f"users on the killed replica ({k['on_killed']['users']}): "
        f"{k['on_killed']['ok']} ok, {k['on_killed']['retried_ok']} ok on the client's one retry, "
        f"{k['on_killed']['failed']} failed; users on the survivor ({k['on_survivor']['users']}): "
        f"{k['on_survivor']['ok']} ok, {k['on_survivor']['retried_ok']} retried, "
        f"{k['on_survivor']['failed']} failed; first failures seen: {k['first_failures'] or 'none'}."
    )
    payload = {"users": args.users, "turns": args.turns, "max_tokens": MAX_TOKENS, "runs": runs, "kill": kill,
               "wall_s": time.perf_counter() - t0}  # fmt: skip
    write_results("replicas", payload, table)


if __name__ == "__main__":
    main()
