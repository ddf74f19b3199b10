"""KDA operator benchmark: longmoe's chunked all-GEMM ``kda_chunk`` against peer PyTorch implementations.

Peers, measured in the same run on the same inputs:
- ``transformers``' pure-PyTorch KDA fallback ``chunk_kimi_delta_attention`` (its default chunk 64, and 16);
- ``flash-linear-attention``'s naive chunk and recurrent references (``fla/ops/kda/naive.py``, loaded from
  the installed files so Triton is not needed).

The seeds' bounded-gate claim is measured in the same run: the bounded all-GEMM operator (the rows above,
``intra="factorised"``) against the two exact paths an unbounded gate can take, fed Kimi-Linear gates
(``kimi_decay``) on the same q, k, v, β and shapes: ``intra="logspace"`` (every in-chunk pair in log
space) and the stronger ``intra="subchunk"`` (secondary chunking as fla does it, taken to every level: the
chunk halved down to single tokens, GEMMs between the halves; ``ops/kda/intra.py``). Their ratios are the
second table.

Forward is timed under ``torch.no_grad()`` (the inference path) for every implementation; forward+backward
with autograd. The roofline is this machine's ``torch.mm`` throughput measured in the same run, and the
operator's share counts the useful FLOPs of the chunked algorithm (``kda_flops``). Every row runs once per
round (``--rounds``, 3); the file keeps each number's median over rounds under its own key, the per-round
times, and each speed-up's per-round median and [min, max] (``speedup_fwd_range``, ``speedup_fwd_bwd_range``).

    python -m bench.kda            # T in {1024, 4096, 16384}, fp32 and bf16; 3 alternating rounds
    python -m bench.kda --quick    # T = 1024, fp32 only, one round (seconds)
    python -m bench.kda --gates-only   # bounded vs log-space only (no peers), T in {1024, 4096}, minutes
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.common import (
    add_rounds_option,
    gemm_roofline,
    markdown_table,
    over_rounds,
    range_cell,
    rounds_arg,
    timeit,
    write_results,
)
from longmoe.ops.gates import bounded_decay, kimi_decay
from longmoe.ops.kda import kda_chunk

B, H, K, V, C = 1, 4, 64, 64, 16
LOGSPACE = "longmoe log-space (unbounded gate)"  # the exact in-chunk paths an unbounded gate needs
SUBCHUNK = "longmoe sub-chunk (unbounded gate)"


def kda_flops(T: int, H: int, K: int, V: int, C: int = 16) -> float:
    """Useful forward FLOPs of the chunked algorithm (per chunk: the two C×C products, the triangular
    inverse, [W|U], the state scan's two GEMMs, and the output's inter/intra terms)."""
    per_chunk = 4 * C * C * K + C**3 / 3 + 2 * C * C * (K + V) + 6 * C * K * V + 2 * C * C * V
    return H * -(-T // C) * per_chunk


def load_peers() -> dict:
    """The peer implementations that are installed (each optional)."""
    peers = {}
    try:
        from transformers.models.kimi_linear.modeling_kimi_linear import (
            chunk_kimi_delta_attention as tf_chunk,
        )

        def tf(q, k, v, g, b, chunk):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return tf_chunk(q, k, v, g, b, chunk_size=chunk)[0]

        peers["transformers chunk64"] = lambda *x: tf(*x, 64)
        peers["transformers chunk16"] = lambda *x: tf(*x, 16)
    except ImportError:
        print("transformers not installed: skipping its KDA fallback", file=sys.stderr)
    spec = importlib.util.find_spec("fla")
    if spec is not None and spec.submodule_search_locations:
        path = Path(spec.submodule_search_locations[0]) / "ops" / "kda" / "naive.py"
        mod_spec = importlib.util.spec_from_file_location("fla_kda_naive", path)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
        peers["fla naive chunk64"] = lambda q, k, v, g, b: mod.naive_chunk_kda(q, k, v, g, b, chunk_size=64)[
            0
        ]
        peers["fla naive recurrent"] = lambda q, k, v, g, b: mod.naive_recurrent_kda(q, k, v, g, b)[0]
    else:
        print("flash-linear-attention not installed: skipping its naive references", file=sys.stderr)
    return peers


def make_inputs(T: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g = bounded_decay(torch.randn(B, T, H, K, generator=gen), torch.zeros(H, K))
    beta = torch.rand(B, T, H, generator=gen)
    return [x.to(dtype) for x in (q, k, v, g, beta)]


def unbounded_gates(T: int, dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    """Kimi-Linear gates ``-e^{A_log}·softplus(f + dt_bias)`` at the values its checkpoints hold
    (``A_log = log U(1, 16)`` per head, ``dt_bias`` ≈ softplus⁻¹(1)): far below the bounded gate's floor."""
    gen = torch.Generator().manual_seed(seed)
    A_log = torch.empty(H, 1).uniform_(1.0, 16.0, generator=gen).log()
    dt_bias = torch.randn(H, K, generator=gen) + 0.5413  # softplus⁻¹(1) = log(e − 1)
    return kimi_decay(torch.randn(B, T, H, K, generator=gen), A_log, dt_bias).to(dtype)


def time_forward(fn, xs, budget: float, stat=statistics.median) -> float:
    def run():
        with torch.no_grad():
            fn(*xs)

    return timeit(run, warmup=1, iters=5, max_seconds=budget, stat=stat)


def time_fwd_bwd(fn, xs, budget: float, stat=statistics.median) -> float:
    leaves = [x.detach().clone().requires_grad_() for x in xs]

    def run():
        for x in leaves:
            x.grad = None
        fn(*leaves).float().sum().backward()

    return timeit(run, warmup=1, iters=3, max_seconds=budget, stat=stat)


def speedups(times: dict[str, float]) -> dict[str, float]:
    """Each other implementation's time over longmoe's, same round (above 1 = longmoe faster)."""
    return {n: t / times["longmoe"] for n, t in times.items() if n != "longmoe"}


def one_round(lengths, dtypes, ours, exact: dict, peers: dict, roof: dict, stat, quick: bool) -> list[dict]:
    """Every (dtype, T) row once: longmoe, the unbounded-gate paths and the peers back to back, with this
    round's speed-ups (peer time / longmoe time)."""
    results = []
    for dt in dtypes:
        dname = str(dt).split(".")[-1]
        for T in lengths:
            xs = make_inputs(T, dt)
            flops = kda_flops(T, H, K, V, C)
            entry = {"T": T, "dtype": dname, "flops_fwd": flops, "fwd_s": {}, "fwd_bwd_s": {}}
            entry["fwd_s"]["longmoe"] = time_forward(ours, xs, 20, stat)
            entry["fwd_bwd_s"]["longmoe"] = time_fwd_bwd(ours, xs, 20, stat)
            xs_unbounded = [*xs[:3], unbounded_gates(T, dt), xs[4]]
            for name, fn in exact.items():
                entry["fwd_s"][name] = time_forward(fn, xs_unbounded, 30, stat)
                entry["fwd_bwd_s"][name] = time_fwd_bwd(fn, xs_unbounded, 60, stat)
            for name, fn in peers.items():
                # the peers are 10-100x slower: forward everywhere, backward only where it fits the budget
                if "recurrent" in name and T > 4096:
                    continue
                entry["fwd_s"][name] = time_forward(fn, xs, 30)
                if T <= 4096 and not quick and "recurrent" not in name and name != "transformers chunk16":
                    entry["fwd_bwd_s"][name] = time_fwd_bwd(fn, xs, 60)
            t_f, t_fb = entry["fwd_s"]["longmoe"], entry["fwd_bwd_s"]["longmoe"]
            entry["roofline_share_fwd"] = flops / t_f / roof[dname]
            entry["roofline_share_fwd_bwd"] = 3 * flops / t_fb / roof[dname]
            entry["speedup_fwd"], entry["speedup_fwd_bwd"] = (
                speedups(entry["fwd_s"]),
                speedups(entry["fwd_bwd_s"]),
            )
            results.append(entry)
            print({k: entry[k] for k in ("T", "dtype", "speedup_fwd", "speedup_fwd_bwd")}, flush=True)
    return results


RANGES = {"speedup_fwd": "speedup_fwd_range", "speedup_fwd_bwd": "speedup_fwd_bwd_range"}


def combine(rounds: list[list[dict]]) -> list[dict]:
    """Per row: every number the median over rounds under its own key (``speedup_fwd`` etc.: the per-round
    ratio's median), ``speedup_fwd_range`` / ``speedup_fwd_bwd_range``: each per-round ratio's median and
    [min, max], and ``rounds``: the per-round times."""
    return [
        over_rounds([r[i] for r in rounds], timed=("fwd_s", "fwd_bwd_s"), ratios=RANGES)
        for i in range(len(rounds[0]))
    ]


def _x(entry: dict, key: str, name: str) -> str:
    return range_cell(entry[RANGES[key]][name], ".1f", "×") if name in entry[key] else "–"


def render(results: list[dict], peers: list[str], exact: list[str], roof: dict, n_rounds: int) -> str:
    rows, gate_rows = [], []
    for e in results:
        t_f, t_fb = e["fwd_s"]["longmoe"], e["fwd_bwd_s"]["longmoe"]
        gate_rows.append(
            [
                e["T"],
                e["dtype"],
                f"{t_f * 1e3:.1f}",
                *(f"{e['fwd_s'][n] * 1e3:.1f}" for n in exact),
                *(_x(e, "speedup_fwd", n) for n in exact),
                f"{t_fb * 1e3:.0f}",
                *(f"{e['fwd_bwd_s'][n] * 1e3:.0f}" for n in exact),
                *(_x(e, "speedup_fwd_bwd", n) for n in exact),
            ]
        )
        rows.append(
            [
                e["T"],
                e["dtype"],
                f"{t_f * 1e3:.1f}",
                f"{100 * e['roofline_share_fwd']:.0f}%",
                *(_x(e, "speedup_fwd", n) for n in peers),
                f"{t_fb * 1e3:.0f}",
                f"{100 * e['roofline_share_fwd_bwd']:.0f}%",
                *(_x(e, "speedup_fwd_bwd", n) for n in ("transformers chunk64", "fla naive chunk64")),
            ]
        )
    header = [
        "T",
        "dtype",
        "fwd ms",
        "fwd % mm roofline",
        *(f"fwd vs {n}" for n in peers),
        "fwd+bwd ms",
        "fwd+bwd % roofline",
        "fwd+bwd vs transformers chunk64",
        "fwd+bwd vs fla naive chunk64",
    ]
    gate_header = [
        "T",
        "dtype",
        "bounded all-GEMM fwd ms",
        "unbounded log-space fwd ms",
        "unbounded sub-chunk fwd ms",
        "fwd speed-up vs log-space",
        "fwd speed-up vs sub-chunk",
        "bounded fwd+bwd ms",
        "log-space fwd+bwd ms",
        "sub-chunk fwd+bwd ms",
        "fwd+bwd speed-up vs log-space",
        "fwd+bwd speed-up vs sub-chunk",
    ]
    return (
        f"KDA operator, B={B} H={H} K=V={K}, chunk {C}; speed-up = peer time / longmoe time in the same "
        f"round, its median [min, max] over {n_rounds} alternating rounds (each round runs every row, "
        "longmoe and the peers back to back); times are medians over the rounds "
        f"(torch.mm roofline: {', '.join(f'{k} {v / 1e9:.0f} GFLOP/s' for k, v in roof.items())}; "
        f"{torch.get_num_threads()} threads, shared machine).\n\n"
        + markdown_table(header, rows)
        + "\n\nBounded vs unbounded decay, the seeds' claim measured: the bounded gate's all-GEMM chunk "
        '(`intra="factorised"`) against the exact in-chunk paths an unbounded gate needs (Kimi-Linear '
        'gates): every pair in log space (`intra="logspace"`) and the chunk halved down to single tokens '
        'with GEMMs between the halves (`intra="subchunk"`, the stronger baseline); same q, k, v, β, '
        "shapes and rounds; speed-up = unbounded time / bounded time, median [min, max] over rounds.\n\n"
        + markdown_table(gate_header, gate_rows)
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="T = 1024, fp32 only (a smoke run in seconds)")
    ap.add_argument(
        "--gates-only",
        action="store_true",
        help="bounded all-GEMM vs the unbounded paths only, no peers, T in {1024, 4096}, fastest of "
        "each run's repeats (results: kda_gates.*, no README)",
    )
    ap.add_argument("--no-readme", action="store_true", help="do not rewrite the README benchmark table")
    add_rounds_option(ap)
    args = ap.parse_args(argv)
    n_rounds = rounds_arg(ap, args)

    lengths = [1024] if args.quick else [1024, 4096] if args.gates_only else [1024, 4096, 16384]
    # --gates-only reads the fastest run of each (a slow sample on a shared machine is interference)
    stat = min if args.gates_only else statistics.median
    dtypes = [torch.float32] if args.quick else [torch.float32, torch.bfloat16]
    peers = {} if args.gates_only else load_peers()
    ours = lambda q, k, v, g, b: kda_chunk(q, k, v, g, b, chunk_size=C)[0]
    exact = {
        name: lambda q, k, v, g, b, mode=mode: kda_chunk(q, k, v, g, b, chunk_size=C, intra=mode)[0]
        for name, mode in ((LOGSPACE, "logspace"), (SUBCHUNK, "subchunk"))
    }
    roof = {str(dt).split(".")[-1]: gemm_roofline(dt) for dt in dtypes}
    print("torch.mm roofline (GFLOP/s):", {k: round(v / 1e9, 1) for k, v in roof.items()}, flush=True)
    rounds = [one_round(lengths, dtypes, ours, exact, peers, roof, stat, args.quick) for _ in range(n_rounds)]
    results = combine(rounds)
    table = render(results, list(peers), list(exact), roof, n_rounds)
    # a smoke run never overwrites the full table, nor does a run without the peers
    name = "kda_quick" if args.quick else "kda_gates" if args.gates_only else "kda"
    write_results(
        name,
        {
            "roofline_flops": roof,
            "shape": dict(B=B, H=H, K=K, V=V, C=C),
            "n_rounds": n_rounds,
            "results": results,
        },
        table,
        update_readme=not (args.no_readme or args.quick or args.gates_only),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
