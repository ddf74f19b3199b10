"""Balancer benchmark: a tiny MoE LM trained from a deliberately skewed router with each balancer.

Same model, data, seed and steps for ``quantile``, ``sign``, ``aux`` and ``none``; only the balancer
differs. The router starts skewed: a few "hot" experts get a large offset along the mean direction of
their layer's input, so nearly every token picks them. Reported per run: batch MaxVio over the steps
(mean over MoE layers, plotted), the final MaxVio (mean of the last 10 steps), MaxVio and dead experts
on the validation windows (global load over all of them), and validation loss.

    python -m bench.balance            # E = 64 (k = 4) and E = 256 (k = 8), a few minutes
    python -m bench.balance --quick    # E = 64 only, a few steps (seconds)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from bench.common import RESULTS, bench_tokenizer, markdown_table, write_results
from longmoe.config import FFNConfig, ModelConfig
from longmoe.data.batch import Batch
from longmoe.data.packing import Packer, collate
from longmoe.layers import balance
from longmoe.model import LongMoE
from longmoe.train.mix import make_mix

BALANCERS = ("quantile", "sign", "aux", "none")


def model_config(E: int, k: int, balancer: str, vocab: int, args) -> ModelConfig:
    ffn = FFNConfig(
        kind="moe",
        n_experts=E,
        top_k=k,
        n_shared=1,
        latent_ratio=2,
        expert_hidden=16,
        shared_hidden=64,
        first_k_dense=0,
        balancer=balancer,
        bias_step=args.bias_step,
        balance_window=2,
        aux_loss_coef=args.aux_coef,
    )
    return ModelConfig(
        vocab_size=vocab,
        d_model=64,
        n_layers=2,
        layer_pattern="LM",
        max_seq_len=4096,
        kda_heads=2,
        kda_head_dim=32,
        kda_gate_rank=8,
        mla_heads=2,
        mla_q_lora_rank=32,
        mla_kv_lora_rank=16,
        mla_head_dim=32,
        mla_v_head_dim=32,
        attn_res_blocks=2,
        ffn=ffn,
    )


def batches(tok, split: str, seed: int, window: int, n_windows: int):
    packer = Packer(make_mix({"file": 1.0}, split, seed, tok), tok.encode, tok.bos_id, tok.eos_id)
    while True:
        yield collate([packer.next_window(window) for _ in range(n_windows)])


@torch.no_grad()
def skew_router(model: LongMoE, batch: Batch, n_hot: int, offset: float) -> None:
    """Give ``n_hot`` experts per MoE layer a logit offset ≈ ``offset`` for a typical token: add
    ``offset · m / |m|²`` to their router rows, ``m`` the mean input of that layer on ``batch``."""
    means = {}
    hooks = [
        m.register_forward_pre_hook(
            lambda mod, inp, i=i: means.__setitem__(i, inp[0].reshape(-1, mod.d_model).mean(0))
        )
        for i, m in enumerate(model.moe_layers())
    ]
    model(batch.input_ids, cu_seqlens=batch.cu_seqlens)
    for h in hooks:
        h.remove()
    for i, m in enumerate(model.moe_layers()):
        mu = means[i]
        m.router.weight[:n_hot] += offset * mu / mu.square().sum()


@torch.no_grad()
def validate(model: LongMoE, val: list[dict]) -> dict:
    """Validation loss and the global load over all validation windows (counted in train mode, no grad)."""
    moe = model.moe_layers()
    saved = [m.step_counts.clone() for m in moe]
    for m in moe:
        m.step_counts.zero_()
    model.train()  # train mode so the layers count their load; no dropout anywhere in the model
    losses = []
    for b in val:
        out = model(b.input_ids, labels=b.labels, cu_seqlens=b.cu_seqlens)
        losses.append(float(out.ce_loss))
    loads = [m.step_counts.clone() for m in moe]
    for m, s in zip(moe, saved):
        m.step_counts.copy_(s)
    return {
        "val_loss": statistics.mean(losses),
        "val_max_vio": statistics.mean(balance.max_vio(c) for c in loads),
        "val_dead_experts": sum(int((c == 0).sum()) for c in loads),
    }


def run(E: int, k: int, balancer: str, tok, args) -> dict:
    torch.manual_seed(args.seed)
    cfg = model_config(E, k, balancer, tok.vocab_size, args)
    model = LongMoE(cfg)
    train = batches(tok, "train", args.seed, args.window, args.windows)
    val_it = batches(tok, "val", args.seed, args.window, args.windows)
    val = [next(val_it) for _ in range(args.val_batches)]
    skew_router(
        model, next(batches(tok, "train", args.seed + 1, args.window, args.windows)), args.hot, args.offset
    )
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    v0 = validate(model, val)
    curve, t0 = [], time.perf_counter()
    for _ in range(args.steps):
        b = next(train)
        model.train()
        out = model(b.input_ids, labels=b.labels, cu_seqlens=b.cu_seqlens)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        moe = model.moe_layers()
        curve.append(statistics.mean(balance.max_vio(m.step_counts) for m in moe))  # this batch
        for m in moe:
            m.update_balance()
    secs = time.perf_counter() - t0
    v = validate(model, val)
    moe = model.moe_layers()
    return {
        "E": E,
        "k": k,
        "balancer": balancer,
        "steps": args.steps,
        "seconds": secs,
        "initial_max_vio": curve[0],
        "initial_val_max_vio": v0["val_max_vio"],
        "final_max_vio": statistics.mean(curve[-10:]),
        "dead_experts_window": sum(m.balance_metrics()["dead_experts"] for m in moe),
        "router_entropy": statistics.mean(m.balance_metrics()["router_entropy"] for m in moe),
        **v,
        "max_vio_curve": curve,
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    Es = sorted({r["E"] for r in results})
    fig, axes = plt.subplots(1, len(Es), figsize=(5.5 * len(Es), 4), squeeze=False)
    for ax, E in zip(axes[0], Es):
        for r in (r for r in results if r["E"] == E):
            ax.plot(r["max_vio_curve"], label=r["balancer"], lw=1.2)
        ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("batch MaxVio (mean over MoE layers)")
        k = next(r["k"] for r in results if r["E"] == E)
        ax.set_title(f"E = {E}, k = {k}, skewed router at step 0")
        ax.grid(alpha=0.3, which="both")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="E = 64 only, 8 steps (seconds)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    p.add_argument("--window", type=int, default=256, help="tokens per packed window")
    p.add_argument("--windows", type=int, default=8, help="windows per batch (one packed row)")
    p.add_argument("--val-batches", type=int, default=4, help="validation batches")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--bias-step", type=float, default=1e-2, help="δ of the quantile and sign balancers")
    p.add_argument("--aux-coef", type=float, default=1e-2, help="coefficient of the aux balance loss")
    p.add_argument("--hot", type=int, default=4, help="experts per layer given the router offset")
    p.add_argument("--offset", type=float, default=1.0, help="router logit offset of the hot experts")
    p.add_argument("--seed", type=int, default=0, help="seed for init and data order")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        args.steps, args.val_batches = 8, 1
    settings = [(64, 4)] if args.quick else [(64, 4), (256, 8)]
    tok = bench_tokenizer(512)
    results = []
    for E, k in settings:
        for bal in BALANCERS:
            r = run(E, k, bal, tok, args)
            print(
                f"E={E} k={k} {bal:8s} maxvio {r['initial_max_vio']:.2f} -> {r['final_max_vio']:.3f} "
                f"val_loss {r['val_loss']:.3f} val_maxvio {r['val_max_vio']:.3f} "
                f"dead {r['val_dead_experts']} ({r['seconds']:.0f}s)",
                flush=True,
            )
            results.append(r)
    name = "balance_quick" if args.quick else "balance"
    png = RESULTS / f"{name}_maxvio.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    plot(results, png)
    header = [
        "E",
        "k",
        "balancer",
        "MaxVio step 0",
        "final MaxVio (last 10)",
        "val MaxVio (global)",
        "val dead experts",
        "router entropy",
        "val loss",
    ]
    rows = [
        [
            r["E"],
            r["k"],
            r["balancer"],
            r["initial_max_vio"],
            r["final_max_vio"],
            r["val_max_vio"],
            r["val_dead_experts"],
            r["router_entropy"],
            r["val_loss"],
        ]
        for r in results
    ]
    md = (
        f"Tiny MoE LM (d = 64, 2 MoE layers, α = 2, expert hidden 16, one shared expert), {args.steps} AdamW "
        f"steps of {args.windows}×{args.window} packed tokens from a router skewed toward {args.hot} experts "
        f"per layer (logit offset {args.offset}); δ = {args.bias_step}, aux coef = {args.aux_coef}. MaxVio = "
        "(max load − mean load) / mean load; batch values are means over the MoE layers; dead experts are "
        "summed over layers (no token in the validation windows).\n\n"
        + markdown_table(header, rows)
        + f"\n\n![MaxVio over steps]({png.name})"
    )
    write_results(name, {"args": vars(args), "runs": results}, md, update_readme=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
