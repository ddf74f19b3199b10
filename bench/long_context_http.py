"""``bench.long_context http``: prompts through ``longmoe serve`` (a child process), time to the first
streamed token and the server's peak RSS rise (docs/benchmarks.md, "Long contexts")."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import torch

from bench.common import bench_tokenizer, counted_spread, markdown_table
from bench.long_context_base import CHUNK, K, load, run_label, tiny_model


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(re.search(key + r":\s+(\d+)", fh.read()).group(1)) * 1024


def run_http(lengths: list[int], rounds: int, threads: int) -> dict:
    """Each prompt (token ids) through ``longmoe serve`` (a child process, ``--max-context`` and
    ``--max-body-kb`` raised, no prefix snapshots): time to the first streamed token as the client
    sees it, and the server's peak RSS rise during the request."""
    import socket
    import subprocess
    import sys
    import tempfile

    import httpx

    from longmoe.checkpoint import save_model_dir

    samples: dict = {n: {"ttft_s": [], "peak_rise": []} for n in lengths}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_model_dir(Path(tmp) / "tiny", tiny_model(), bench_tokenizer(512))
        with socket.socket() as sk:
            sk.bind(("127.0.0.1", 0))
            port = sk.getsockname()[1]
        longest = max(lengths)
        cmd = [sys.executable, "-m", "longmoe", "serve", "--model", str(model_dir), "--port", str(port),
               "--max-context", str(longest + 64), "--max-body-kb", str(longest * 8 // 1024 + 64),
               "--prefill-chunk", str(CHUNK), "--no-prefix-cache", "--log-level", "warning",
               "--cache-budget-mb", str(max(1024, longest * 2 // 1024))]  # fmt: skip
        # the server returns freed memory (LONGMOE_MALLOC_TUNE=0): else each request's rise counts only
        # the growth past the earlier requests' high-water mark
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "LONGMOE_MALLOC_TUNE": "0"}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if httpx.get(url + "/ready").status_code == 200:  # /health is 200 while loading
                        break
                except httpx.TransportError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("longmoe serve did not come up")
                time.sleep(0.5)
            for r in range(rounds):
                for n in lengths:
                    ids = torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(n + r)).tolist()
                    body = {"model": "tiny", "prompt": ids, "max_tokens": 4, "temperature": 0, "stream": True,
                            "ignore_eos": True}  # fmt: skip
                    before = _status(proc.pid, "VmRSS")
                    with open(f"/proc/{proc.pid}/clear_refs", "w") as fh:
                        fh.write("5")
                    t0, ttft = time.perf_counter(), None
                    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=7200) as resp:
                        resp.raise_for_status()
                        for line in resp.iter_lines():
                            if ttft is None and line.startswith("data: {"):
                                ttft = time.perf_counter() - t0
                    samples[n]["ttft_s"].append(ttft)
                    samples[n]["peak_rise"].append(_status(proc.pid, "VmHWM") - before)
                    print("http", r, n, {k: v[-1] for k, v in samples[n].items()}, flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    rows = {n: {k: counted_spread(v) for k, v in s.items()} for n, s in samples.items()}
    for n, row in rows.items():
        row["prefill_tok_s"] = counted_spread([n / t for t in samples[n]["ttft_s"]])
    return {
        "rows": rows,
        "threads": threads,
        "chunk": CHUNK,
        "load_avg": load(),
        "server_malloc_tuned": False,
    }


def http_table(res: dict) -> str:
    header = ["prompt tokens", "n", "TTFT s [min, max]", "prefill tok/s", "server peak RSS rise MB", "run"]
    rows = []
    for n, r in res["rows"].items():
        t = r["ttft_s"]
        rows.append([f"{int(n) // K}K" + ("" if t["n"] > 1 else " (1 sample)"), t["n"],
                     f"{t['median']:.1f} [{t['min']:.1f}, {t['max']:.1f}]", r["prefill_tok_s"]["median"],
                     r["peak_rise"]["median"] / 1e6, run_label(r, res)])  # fmt: skip
    return markdown_table(header, rows)
