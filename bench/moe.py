"""MoE layer benchmark: longmoe's ``MoELayer`` against transformers' DeepSeek-V3 MoE block, same shapes.

Both run the same routed experts (sigmoid router, top-k, renormalised weights, SwiGLU experts of width
``f``, one shared expert) on the same tokens with the *same weights* (ours are copied into the peer, so
the outputs are checked equal before anything is timed). Peers: transformers' default experts
implementation (a Python loop over the experts hit) and its ``grouped_mm`` one (``torch._grouped_mm``),
chosen through ``config._experts_implementation``.

FLOPs are the useful work only (router, latent projections, k routed experts per token, shared expert;
padding not counted); fwd+bwd counts 3× the forward. The roofline is this machine's peak ``torch.mm``
throughput, read just before and after each row's timings (the higher of the two). The default
transformers loop allocates a full-size gradient per expert hit in backward (minutes at E = 896), so
for E > 64 its fwd+bwd is timed once per round (one repetition, no warm-up) and in fp32 only.

Every row runs once per round (``--rounds``, 3); the file keeps each number's median over rounds under
the row's keys, the per-round times, and each ratio's per-round median and [min, max] (``ratios``).

    python -m bench.moe            # E in {8, 64, 256, 896}, fp32 and bf16, plus α = 4; 3 alternating rounds
    python -m bench.moe --quick    # E in {8, 64}, 512 tokens, fp32, one round (seconds)
    LONGMOE_MALLOC_TUNE=0 python -m bench.moe   # glibc's default allocator behaviour, for both peers
                                                # (results in moe_malloc_default.*, README untouched)
"""

from __future__ import annotations

import argparse
import warnings

import torch

from bench.common import (
    MALLOC_TUNED,
    add_rounds_option,
    gemm_roofline,
    markdown_table,
    over_rounds,
    range_cell,
    rounds_arg,
    timeit,
    write_results,
)
from longmoe.config import FFNConfig
from longmoe.layers.moe import MoELayer

D, F_HID, K, SHARED = 512, 128, 8, 128
DEFAULT_LOOP_MAX_E = 64  # transformers' loop backward is minutes beyond this


def moe_flops(n_tokens: int, d: int, cfg: FFNConfig) -> float:
    """Useful forward FLOPs of one MoE layer call (2 per multiply-add)."""
    l = cfg.latent_dim(d)
    f = 2 * n_tokens * d * cfg.n_experts  # router
    f += 2 * n_tokens * 2 * d * l if cfg.latent_ratio > 1 else 0
    f += 2 * n_tokens * cfg.top_k * 3 * l * cfg.expert_hidden
    f += 2 * n_tokens * cfg.n_shared * 3 * d * cfg.shared_hidden
    return float(f)


def make_peer(layer: MoELayer, impl: str):
    """transformers' DeepseekV3MoE with our layer's weights (α = 1 only), or None if unavailable."""
    try:
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    except ImportError:
        return None
    cfg = layer.cfg
    c = DeepseekV3Config(
        hidden_size=layer.d_model,
        moe_intermediate_size=cfg.expert_hidden,
        n_routed_experts=cfg.n_experts,
        num_experts_per_tok=cfg.top_k,
        n_shared_experts=cfg.n_shared,
        n_group=1,
        topk_group=1,
        norm_topk_prob=True,
        routed_scaling_factor=cfg.routed_scale,
        hidden_act="silu",
    )
    c._experts_implementation = impl
    peer = DeepseekV3MoE(c)
    f = cfg.expert_hidden
    with torch.no_grad():
        peer.gate.weight.copy_(layer.router.weight)
        peer.experts.gate_up_proj.copy_(layer.w_in.transpose(1, 2))  # [E, 2f, d]
        peer.experts.down_proj.copy_(layer.w_out.transpose(1, 2))  # [E, d, f]
        w = layer.shared.w_in.weight
        peer.shared_experts.gate_proj.weight.copy_(w[: cfg.n_shared * f])
        peer.shared_experts.up_proj.weight.copy_(w[cfg.n_shared * f :])
        peer.shared_experts.down_proj.weight.copy_(layer.shared.w_out.weight)
    return peer


def time_module(mod, x: torch.Tensor, backward: bool, iters: int, warmup: int = 1) -> float:
    if not backward:
        with torch.no_grad():
            return timeit(lambda: mod(x), warmup=warmup, iters=iters)
    xg = x.detach().clone().requires_grad_()

    def step():
        mod.zero_grad(set_to_none=True)
        mod(xg).float().sum().backward()

    return timeit(step, warmup=warmup, iters=iters, max_seconds=600.0)


def run_case(
    E: int,
    n_tokens: int,
    dtype: torch.dtype,
    alpha: int,
    iters: int,
    peers: bool,
    peer_impls: tuple[str, ...] = ("eager", "grouped_mm"),
):
    """Rows ``[E, dtype, α, impl, fwd s, fwd/roof, fwd+bwd s, fwd+bwd/roof, max rel err, roof GFLOP/s]``.

    The roofline of each row is the peak ``torch.mm`` read just before and just after that row's
    timings (the higher): this machine's speed drifts by ±30% over minutes, so a roofline read once at
    the start would misstate shares measured later.
    """
    cfg = FFNConfig(
        kind="moe",
        n_experts=E,
        top_k=K,
        n_shared=1,
        latent_ratio=alpha,
        expert_hidden=F_HID,
        shared_hidden=SHARED,
    )
    torch.manual_seed(0)
    layer = MoELayer(D, cfg)  # N(0, 0.02) router and experts: non-degenerate routing
    x = torch.randn(n_tokens, D)
    flops = moe_flops(n_tokens, D, cfg)
    dt = str(dtype).split(".")[1]
    rows = []
    impls = {"longmoe": layer}
    if peers and alpha == 1:
        for impl in peer_impls:
            peer = make_peer(layer, impl)
            if peer is not None:
                impls[f"transformers {impl}"] = peer
    ref = None
    for name, mod in impls.items():
        mod = mod.to(dtype)
        xd = x.to(dtype)
        with torch.no_grad():
            try:
                out = mod(xd.unsqueeze(0)).squeeze(0).float()
            except Exception as e:  # a peer that cannot run this dtype is reported, not fatal
                rows.append([E, dt, alpha, name, f"error: {type(e).__name__}"] + [""] * 5)
                continue
        err = 0.0 if ref is None else float((out - ref).abs().max() / ref.abs().max())
        ref = out if ref is None else ref
        roof = gemm_roofline(dtype)
        tf = time_module(mod, xd, False, iters)
        slow_loop = name == "transformers eager" and E > DEFAULT_LOOP_MAX_E
        if slow_loop and dtype != torch.float32:
            tb = float("nan")  # minutes per call: timed once in fp32 only
        elif slow_loop:
            tb = time_module(mod, xd, True, 1, warmup=0)  # one repetition, no warm-up
        else:
            tb = time_module(mod, xd, True, iters)
        roof = max(roof, gemm_roofline(dtype))
        rows.append([E, dt, alpha, name, tf, flops / tf / roof, tb, 3 * flops / tb / roof, err, roof / 1e9])
    return rows


HEADER = ["E", "dtype", "α", "impl", "fwd s", "fwd/roof", "fwd+bwd s", "fwd+bwd/roof", "max rel err",
          "roof GFLOP/s"]  # fmt: skip
VS_PEER, VS_E8 = "speed-up vs transformers grouped_mm", "time / E=8"  # keys of a ratio row


def one_round(
    Es: list[int], dtypes: list[torch.dtype], n_tokens: int, iters: int, alpha4: bool
) -> list[list]:
    """Every row of the grid once (each case's implementations back to back): ``run_case``'s rows."""
    rows = []
    for dtype in dtypes:
        for E in Es:
            rows += run_case(E, n_tokens, dtype, 1, iters, True)
        if alpha4:
            rows += run_case(896, n_tokens, dtype, 4, iters, False)
    return rows


def _timed(r: list) -> bool:
    return not isinstance(r[4], str)  # an error row holds its message in the time's place


def round_ratios(rows: list[list]) -> list[dict]:
    """This round's ratios, one per longmoe row: the grouped_mm peer's time over longmoe's (above 1 =
    longmoe faster), where the peer ran, and longmoe's time over its own at E = 8 (same dtype)."""
    by = {tuple(r[:4]): dict(zip(HEADER, r)) for r in rows if _timed(r)}
    out = []
    for (E, dt, a, name), r in by.items():
        if name != "longmoe":
            continue
        ratio = {"E": E, "dtype": dt, "α": a}
        if (g := by.get((E, dt, a, "transformers grouped_mm"))) is not None:
            ratio[VS_PEER] = {k: g[k] / r[k] for k in ("fwd s", "fwd+bwd s")}
        if (base := by.get((8, dt, 1, "longmoe"))) is not None:
            ratio[VS_E8] = {k: r[k] / base[k] for k in ("fwd s", "fwd+bwd s")}
        out.append(ratio)
    return out


def combine(rounds: list[list[list]]) -> tuple[list, list[dict]]:
    """The rounds' rows -> (table rows, each number the median over rounds, an error row as the first
    round had it; ratio rows, each ratio's per-round median and [min, max]). Rows align by position:
    every round runs the same grid, and ``run_case`` gives one row per implementation, error or not."""
    table = []
    for i in range(len(rounds[0])):
        per = [r[i] for r in rounds]
        if not all(_timed(r) for r in per):
            table.append(next(r for r in per if not _timed(r)))
            continue
        row = over_rounds([dict(zip(HEADER, r)) for r in per], timed=("fwd s", "fwd+bwd s"), ratios={})
        table.append([row[k] for k in HEADER] + [row["rounds"]])
    per_round = [round_ratios(r) for r in rounds]
    ratios = []
    for i in range(len(per_round[0])):
        per = [r[i] for r in per_round]
        ratios.append(over_rounds(per, timed=(), ratios={k: k for k in (VS_PEER, VS_E8) if k in per[0]}))
    return table, ratios


def _cell(ratio: dict, key: str, part: str, unit: str = "") -> str:
    return range_cell(ratio[key][part], ".2f", unit) if key in ratio else "-"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="E in {8, 64}, 512 tokens, fp32 only")
    p.add_argument("--iters", type=int, default=3, help="timed repetitions per measurement (median)")
    add_rounds_option(p)
    args = p.parse_args(argv)
    n_rounds = rounds_arg(p, args)
    warnings.simplefilter("ignore")
    torch.set_num_threads(2)
    n_tokens = 512 if args.quick else 4096
    Es = [8, 64] if args.quick else [8, 64, 256, 896]
    dtypes = [torch.float32] if args.quick else [torch.float32, torch.bfloat16]
    table, ratios = combine(
        [one_round(Es, dtypes, n_tokens, args.iters, not args.quick) for _ in range(n_rounds)]
    )
    results = [{**dict(zip(HEADER, r)), "rounds": r[-1]} for r in table if _timed(r)]
    table = [r[: len(HEADER)] for r in table]
    roofs = {
        str(dt): [r[9] * 1e9 for r in table if r[1] == str(dt).split(".")[1] and _timed(r)] for dt in dtypes
    }
    ratio_rows = [
        [
            x["E"],
            x["dtype"],
            x["α"],
            _cell(x, VS_PEER, "fwd s", "×"),
            _cell(x, VS_PEER, "fwd+bwd s", "×"),
            _cell(x, VS_E8, "fwd s"),
            _cell(x, VS_E8, "fwd+bwd s"),
        ]
        for x in ratios
    ]
    md = (
        f"MoE layer, {n_tokens} tokens, d = {D}, f = {F_HID}, k = {K}, 1 shared expert; roofline = peak "
        + "torch.mm read around each row (range "
        + ", ".join(
            f"{k.split('.')[1]} {min(v) / 1e9:.0f}-{max(v) / 1e9:.0f} GFLOP/s" for k, v in roofs.items()
        )
        + "; shared machine; "
        + ("freed memory kept for reuse, longmoe/runtime.py" if MALLOC_TUNED else "glibc default malloc")
        + f"). Every number is the median over {n_rounds} alternating rounds (each round runs every row, "
        + "a case's implementations back to back).\n\n"
        + markdown_table(HEADER, table)
        + f"\n\ntransformers eager fwd+bwd for E > {DEFAULT_LOOP_MAX_E}: one repetition per round, fp32 only"
        + " (nan = not run)."
        + " α = 4 rows count their own (smaller) FLOPs."
        + " Shared 2-core machine with other jobs running: read the ratios, not the seconds."
        + "\n\nlongmoe speed-up over transformers grouped_mm, and time relative to E = 8: each the per-round "
        + "ratio's median [min, max]:\n\n"
        + markdown_table(
            ["E", "dtype", "α", "fwd speed-up", "fwd+bwd speed-up", "fwd time / E=8", "fwd+bwd time / E=8"],
            ratio_rows,
        )
    )
    name = ("moe_quick" if args.quick else "moe") + ("" if MALLOC_TUNED else "_malloc_default")
    write_results(
        name,
        {"roofline_flops": roofs, "n_rounds": n_rounds, "rows": results, "ratios": ratios},
        md,
        update_readme=not args.quick and MALLOC_TUNED,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
