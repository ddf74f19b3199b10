"""Many users at once: ``longmoe serve`` against llama.cpp's own ``llama-server``, over HTTP, on one CPU.

The checkpoint and GGUFs of ``bench.cpu_serve`` (``bench/cpu_peer.py``; ``--size 15m`` by default: d 256,
8 layers LLLM x2, 4 heads of 64, 16 experts top-4, vocab 2048), the same weights in every server. Each
server is a child process on 127.0.0.1 with 2 threads (``--threads``), all started at once, warmed up, and
stopped by PID at the end:

- ``longmoe serve`` eager and ``--compile`` (fp32, and int8 ``--compile`` with the head packed, as in
  q8_0), ``--max-batch 32`` (its default), per-client limit off (every client is 127.0.0.1), its other
  defaults (prefix cache on);
- ``llama-server`` (``make llama-server``: built from the llama.cpp vendored in the llama-cpp-python
  source package) on the f32 and q8_0 GGUFs, ``--parallel 32``, flash attention on, context 512 per slot,
  its other defaults (continuous batching, prompt cache on).

A measurement sends N requests at once (N = 1 / 8 / 32 clients), each a distinct 256-token prompt (token
ids, seeded, made on the spot; the same prompts for every server in a round, new ones each round) for 64
new tokens, greedy, ``ignore_eos``, to ``/v1/completions``. Generated tokens are counted from the
responses (``usage.completion_tokens`` of the requests that succeeded), the wall runs from the first request
sent to the last response, and tokens/s is their ratio. Each server first gets one untimed round at every
concurrency (the warm-up: ``--compile``'s graphs, llama.cpp's first batches), excluded from the rows. Then
``--rounds`` rounds, each running every server at each concurrency in turn (the order rotates by round), so
a burst of other work on this shared machine hits every server alike. The servers' own CPU seconds per
generated token (``/proc``) are recorded beside the wall-clock rate: they depend less on the load.

A target ("longmoe tokens/s >= llama-server's", per concurrency and precision class) is judged by
``bench.cpu_serve.verdict`` on the ratio's range over rounds (worst round of one server against the best of
the other): met, missed, or not settled; fewer than 3 rounds carry no verdict. A request that fails (not 200,
or ``finish_reason`` "error") is counted and its output kept in the JSON.

    make llama-server                                     # once: fetch and build the peer
    python -m bench.cpu_serve_users --workdir /work/bench-cache/cpu_serve --note "..."
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench import common, cpu_peer
from bench.common import markdown_table, write_results
from bench.cpu_serve import ratio_range, verdict
from bench.http_load import HOST, Sample, Server, cpu_seconds, free_port, run_clients
from longmoe.report.provenance import load_average

ROOT = Path(__file__).resolve().parent.parent
MAKE_TARGET = "make llama-server"
DEFAULT_BINARY = ROOT / ".cache" / "llama-server" / "bin" / "llama-server"
BUILD_INFO = DEFAULT_BINARY.parent / "build-info.txt"  # written by the make target
BINARY_ENV = "LLAMA_SERVER"
PROMPT_TOKENS, NEW_TOKENS, SLOTS = 256, 64, 32
SLOT_CTX = 512  # llama-server's context per slot: prompt + new tokens fit
# name -> (kind, precision class, quantize / GGUF type, compile)
ENGINES = {
    "longmoe fp32": ("longmoe", "fp32", None, False),
    "longmoe fp32 --compile": ("longmoe", "fp32", None, True),
    "longmoe int8 --compile": ("longmoe", "int8", "int8", True),
    "llama-server f32": ("llama", "fp32", "f32", False),
    "llama-server q8_0": ("llama", "int8", "q8_0", False),
}
PEER = {"fp32": "llama-server f32", "int8": "llama-server q8_0"}


def find_binary(flag: str | None) -> Path:
    """The llama-server to run: ``--llama-server``, else ``$LLAMA_SERVER``, else the make target's output;
    a one-line ``SystemExit`` naming the make target when it is not an executable file."""
    path = Path(flag or os.environ.get(BINARY_ENV) or DEFAULT_BINARY)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise SystemExit(
            f"error: no llama-server at {path}: build it with `{MAKE_TARGET}` "
            f"(or pass --llama-server PATH / set {BINARY_ENV})"
        )
    return path


def prompts(n: int, seed: int, length: int = PROMPT_TOKENS, vocab: int = 512) -> list[list[int]]:
    """``n`` distinct token-id prompts (ids 3..vocab-1: inside both tokenizers), seeded."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


# --------------------------------------------------------------------------------------------- servers
def longmoe_cmd(model_dir: Path, port: int, quantize: str | None, compile: bool) -> list[str]:
    cmd = [sys.executable, "-m", "longmoe", "serve", "--model", str(model_dir), "--port", str(port)]
    cmd += f"--host {HOST} --model-name m --max-batch {SLOTS} --max-requests-per-client 0".split()
    cmd += ["--log-level", "warning"] + (["--quantize", quantize, "--quantize-head"] if quantize else [])
    return cmd + (["--compile"] if compile else [])


def llama_cmd(binary: Path, gguf: Path, port: int, threads: int) -> list[str]:
    """llama-server as its users run it, but for the compared settings: threads, slots, flash attention."""
    cmd = [str(binary), "-m", str(gguf), "--port", str(port)]
    return (
        cmd
        + f"--host {HOST} -t {threads} -tb {threads} --parallel {SLOTS} -c {SLOTS * SLOT_CTX} -fa on".split()
    )


def start_servers(names: list[str], paths: dict, binary: Path, threads: int, logdir: Path) -> dict:
    out: dict[str, Server] = {}
    try:
        for name in names:
            kind, _, q, comp = ENGINES[name]
            port, log = free_port(), logdir / (re.sub(r"\W+", "_", name) + ".log")
            if kind == "longmoe":
                env = {"OMP_NUM_THREADS": str(threads)}
                out[name] = Server(name, longmoe_cmd(paths["longmoe"], port, q, comp), env, "/ready", log)
            else:
                out[name] = Server(name, llama_cmd(binary, paths[q], port, threads), {}, "/health", log)
            out[name].wait_ready()  # one at a time: a start-up compile does not share the cores
    except BaseException:
        for s in out.values():
            s.stop()
        raise
    return out


def llama_provenance(binary: Path, servers: dict) -> dict:
    """llama-server's version and build flags (the make target's ``build-info.txt``), the system info it
    prints at start-up, and each llama-server command line."""
    v = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    info = BUILD_INFO.read_text() if binary == DEFAULT_BINARY and BUILD_INFO.exists() else None
    out: dict = {
        "binary": str(binary),
        "version": (v.stdout + v.stderr).strip(),
        "build_info": info,
        "sha256": hashlib.sha256(binary.read_bytes()).hexdigest(),
    }
    for name, s in servers.items():
        if ENGINES[name][0] == "llama":
            out.setdefault("commands", {})[name] = " ".join(s.cmd)
            m = re.search(r"system_info: .*", s.log.read_text(errors="replace"))
            out["system_info"] = m.group(0) if m else None
    return out


def version_line(llama: dict) -> str:
    """What the table says llama-server is: the make target's first build-info line, else ``--version``."""
    text = llama.get("build_info") or llama.get("version") or "not run"
    return text.strip().splitlines()[0]


# ------------------------------------------------------------------------------------------- measuring
def measure(
    servers: dict,
    concurrency: list[int],
    rounds: int,
    new_tokens: int,
    on_round: Callable | None = None,
    warmup: tuple[list[int], int] | None = None,
) -> dict:
    """``{"warmup": {server: {c: sample}}, "rounds": [{"load_average", server: {c: sample}}]}``;
    ``on_round(res)`` after each round (the run writes its results there: one cut short keeps its rounds);
    ``warmup``: (clients, new tokens) of the untimed warm-up, by default a whole round's."""
    w_clients, w_tokens = warmup or (concurrency, new_tokens)

    def sample(s: Server, c: int, seed: int, tokens: int = new_tokens) -> Sample:
        cpu0 = cpu_seconds(s.proc.pid)
        out = run_clients(s.url, prompts(c, seed), tokens)
        out.server_cpu_s = cpu_seconds(s.proc.pid) - cpu0
        print(f"{s.name} x{c}: {out.tok_s:.0f} tok/s, {out.ok}/{c} ok", flush=True)
        for f in out.failures[:3]:
            print("  failed:", f, flush=True)
        return out

    names = list(servers)
    res: dict = {
        "warmup": {
            n: {c: sample(servers[n], c, 999_000 + c, w_tokens).to_dict() for c in w_clients} for n in names
        },
        "rounds": [],
    }
    for r in range(rounds):
        row: dict = {"load_average": {"start": load_average()}}
        order = names[r % len(names) :] + names[: r % len(names)]
        for c in concurrency:
            for n in order:
                row.setdefault(n, {})[c] = sample(servers[n], c, 1000 * r + c).to_dict()
        row["load_average"]["end"] = load_average()
        res["rounds"].append(row)
        if on_round is not None:
            on_round(res)
    return res


def summarize(res: dict, concurrency: list[int]) -> dict:
    """Per server and concurrency: tok/s and server CPU ms/token over rounds, requests ok; the targets."""
    names = [n for n in ENGINES if res["rounds"] and n in res["rounds"][0]]
    rows: dict = {}
    for n in names:
        for c in concurrency:
            ss = [rd[n][c] for rd in res["rounds"]]
            tps = [s["tok_s"] for s in ss]
            cpu = [1e3 * s["server_cpu_s"] / s["tokens"] for s in ss if s["tokens"] and s["server_cpu_s"]]
            rows.setdefault(n, {})[c] = {
                "tok_s": {"median": statistics.median(tps), "min": min(tps), "max": max(tps), "n": len(tps)},
                "cpu_ms_per_token": statistics.median(cpu) if cpu else None,
                "ok": sum(s["ok"] for s in ss),
                "requests": sum(s["clients"] for s in ss),
                "warmup_ok": sum(w["ok"] for w in res["warmup"][n].values()),
                "warmup_requests": sum(w["clients"] for w in res["warmup"][n].values()),
            }
    goals = []
    for n in names:
        kind, cls, _, _ = ENGINES[n]
        if kind != "longmoe" or PEER[cls] not in rows:
            continue
        for c in concurrency:
            ours = [rd[n][c]["tok_s"] for rd in res["rounds"]]
            peer = [rd[PEER[cls]][c]["tok_s"] for rd in res["rounds"]]
            r = ratio_range(ours, peer)
            goals.append(
                {
                    "target": f"{n} tok/s >= {PEER[cls]} @ {c} clients",
                    "value": r["median"],
                    "range": [r["min"], r["max"]],
                    "n": r["n"],
                    "verdict": verdict(r["min"], r["max"], r["n"], lambda x: x >= 1.0),
                }
            )
    return {"rows": rows, "targets": goals}


def table(summary: dict, concurrency: list[int], meta: dict) -> str:
    rows: list[list[object]] = []
    for c in concurrency:
        for n, by_c in summary["rows"].items():
            s = by_c[c]
            t = s["tok_s"]
            label = f"[{t['min']:.0f}, {t['max']:.0f}] n={t['n']}" + (" (1 sample)" if t["n"] == 1 else "")
            cpu = s["cpu_ms_per_token"]
            rows.append(
                [
                    c,
                    n,
                    t["median"],
                    label,
                    "" if cpu is None else f"{cpu:.2f}",
                    f"{s['ok']}/{s['requests']} (warm-up {s['warmup_ok']}/{s['warmup_requests']})",
                ]
            )
    md = [
        markdown_table(
            [
                "clients",
                "server",
                "generated tok/s (median)",
                "[min, max] over rounds",
                "server CPU ms/token",
                "requests ok",
            ],
            rows,
        ),
        "",
    ]
    goals = [
        [
            g["target"],
            f"{g['value']:.2f}x",
            f"[{g['range'][0]:.2f}, {g['range'][1]:.2f}] n={g['n']}",
            g["verdict"],
        ]
        for g in summary["targets"]
    ]
    md += [markdown_table(["target", "ratio (median)", "range", "verdict"], goals), ""]
    la = meta["load_average"]
    md.append(
        f"{meta['label']} Kimi-Linear checkpoint (random weights, the same weights in every server), "
        f"{meta['threads']} threads per server, {PROMPT_TOKENS}-token prompts + {meta['new_tokens']} new "
        f"tokens, greedy, `ignore_eos`; tokens counted from the responses, wall from the first request sent "
        f"to the last response; {meta.get('warmup', 'one untimed warm-up round per server')}, excluded; "
        f"{meta['rounds']} alternating round(s)"
        + (f" of {meta['rounds_planned']} planned" if meta.get("rounds_planned", 0) > meta["rounds"] else "")
        + f". llama-server: {meta['llama_version']}, `--parallel {SLOTS}`, "
        f"`-fa on`, {SLOT_CTX} context per slot, its other defaults; longmoe serve: `--max-batch {SLOTS}`, "
        f"its other defaults. Server CPU ms/token: the server process's user + system CPU time over the "
        f"generated tokens (median over rounds). Measured {meta['measured_at']} on a shared 2-core machine, "
        f"load average {la['start']} at start, {la['end']} at end, {meta['cpu_s']:,.0f} CPU s "
        f"in all (client and server processes, start-up and compile included)"
        + (f"; {meta['note']}" if meta["note"] else "")
        + "."
    )
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=[k for k in cpu_peer.SIZES], default="15m", help="checkpoint (15m)")
    ap.add_argument("--workdir", type=Path, default=Path("runs/cpu_serve"), help="cached model and GGUFs")
    ap.add_argument(
        "--llama-server", default=None, help=f"the binary (default ${BINARY_ENV}, else {MAKE_TARGET}'s)"
    )
    ap.add_argument("--threads", type=int, default=2, help="threads per server (2)")
    ap.add_argument("--clients", default="1,8,32", help="concurrent clients per measurement (1,8,32)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, >= 1 (3)")
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help=f"tokens per request ({NEW_TOKENS})")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated servers (all)")
    ap.add_argument(
        "--short-warmup",
        action="store_true",
        help="warm up with 2 clients x 8 tokens per server instead of a whole round (a loaded machine)",
    )
    ap.add_argument("--note", default="", help="the machine's conditions during this run")
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite docs/benchmarks.md")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.engines.split(",") if n.strip()]
    if unknown := [n for n in names if n not in ENGINES]:
        raise SystemExit(f"error: --engines: unknown {unknown}; choose from {list(ENGINES)}")
    concurrency = [int(c) for c in args.clients.split(",")]
    if args.rounds < 1:
        raise SystemExit(f"error: --rounds: at least 1, not {args.rounds}")
    if max(concurrency) > SLOTS:
        raise SystemExit(f"error: --clients: at most {SLOTS} (the servers' batch and slot count)")
    binary = find_binary(args.llama_server) if any(ENGINES[n][0] == "llama" for n in names) else None
    paths = cpu_peer.build(
        args.workdir / {"quick": "quick", "0.3b": "full", "15m": "15m"}[args.size], args.size
    )
    logdir = args.workdir / "users_logs"
    logdir.mkdir(parents=True, exist_ok=True)
    # SIGTERM (and SIGINT, ignored in a background job) unwinds through the servers' stop below
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    load0, cpu0 = load_average(), time.process_time()
    servers = start_servers(names, paths, binary, args.threads, logdir)
    name = "cpu_serve_users" + ("" if args.size == "15m" else f"_{args.size.replace('.', '')}")

    def publish(res: dict) -> None:
        """Write the results of the rounds so far (servers still up: their CPU time and logs are read)."""
        cpu_s = time.process_time() + sum(cpu_seconds(s.proc.pid) for s in servers.values()) - cpu0
        # a server that failed a request: its log's end goes into the JSON beside the failures
        failed = {n for part in [res["warmup"], *res["rounds"]] for n, by_c in part.items()
                  if n in servers and any(x["failures"] for x in by_c.values())}  # fmt: skip
        res["failed_server_logs"] = {n: servers[n].tail(8000) for n in sorted(failed)}
        summary = summarize(res, concurrency)
        meta = {
            "label": cpu_peer.LABEL[args.size],
            "threads": args.threads,
            "new_tokens": args.new_tokens,
            "rounds": len(res["rounds"]),
            "rounds_planned": args.rounds,
            "warmup": "untimed warm-up: 2 clients x 8 tokens per server"
            if args.short_warmup
            else "one untimed warm-up round per server and concurrency",
            "llama_version": version_line(llama),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu_s": cpu_s,
            "load_average": {"start": load0, "end": load_average()},
            "note": args.note,
        }
        payload = {
            "model": {"size": args.size, "kimi_shapes": cpu_peer.kimi_shapes(args.size)},
            "settings": {
                "prompt_tokens": PROMPT_TOKENS,
                "new_tokens": args.new_tokens,
                "clients": concurrency,
                "slots": SLOTS,
                "slot_ctx": SLOT_CTX,
                "threads": args.threads,
            },  # fmt: skip
            "commands": {n: " ".join(s.cmd) for n, s in servers.items()},
            "llama_server": llama,
            "measured": res,
            "summary": summary,
            "meta": meta,
            "commit": common.START_COMMIT,
        }
        md = table(summary, concurrency, meta)
        write_results(name, payload, md, update_readme=not (args.no_readme or args.size != "15m"))

    try:
        llama = llama_provenance(binary, servers) if binary else {}
        warm = ([2], 8) if args.short_warmup else None
        measure(servers, concurrency, args.rounds, args.new_tokens, on_round=publish, warmup=warm)
    finally:
        for s in servers.values():
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
