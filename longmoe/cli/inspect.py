"""``longmoe inspect``: parameters, sparsity and cache memory of a config, computed from the config alone.

The numbers are ``accounting.py``'s (parameters) and ``memory.py``'s (bytes); ``--parallel`` adds
``distributed.plan``'s per-device mapping; ``--quantize`` the quantized weight bytes, from the model
built on the ``meta`` device (shapes only, nothing allocated).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from longmoe.accounting import PARTS, param_counts, vision_accounting
from longmoe.config import ModelConfig
from longmoe.distributed.parallel_dims import ParallelDims
from longmoe.distributed.plan import format_plan, plan
from longmoe.memory import cache_accounting, training_memory, weight_footprint
from longmoe.ops.quant import MODES as QUANT_MODES
from longmoe.presets import preset


def report(cfg: ModelConfig) -> dict[str, Any]:
    total, active = param_counts(cfg), param_counts(cfg, active=True)
    t, a = sum(total.values()), sum(active.values())
    f = cfg.ffn
    return {
        "total_params": t,
        "active_params": a,
        "active_fraction": a / t,
        "sparsity": 1.0 - a / t,
        "routed_sparsity": (1.0 - f.top_k / f.n_experts) if f.kind == "moe" else 0.0,
        "params": total,
        "active": active,
        "layers": {
            "n_layers": cfg.n_layers,
            "kda": cfg.layer_types.count("L"),
            "mla": cfg.layer_types.count("M"),
            "moe": sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers)),
        },
        "max_seq_len": cfg.max_seq_len,
        "cache": cache_accounting(cfg),
        "training_bytes": training_memory(cfg),
        "vision": vision_accounting(cfg),
    }


def _h(n: float, unit: str = "") -> str:
    for div, s in ((1e12, "T"), (1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{s}{unit}"
    return f"{n:.0f}{unit}"


def _bytes(n: float) -> str:
    for div, s in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= div:
            return f"{n / div:.3g} {s}"
    return f"{n:.0f} B"


def format_report(r: dict[str, Any], name: str) -> str:
    lines = [
        f"longmoe inspect: {name}",
        f"  layers: {r['layers']['n_layers']} ({r['layers']['kda']} KDA, {r['layers']['mla']} MLA, "
        f"{r['layers']['moe']} MoE), max_seq_len {r['max_seq_len']:,}",
        "",
        f"  {'part':<16}{'total':>12}{'active/token':>16}",
    ]
    for k in PARTS:
        if r["params"][k] or r["active"][k]:
            lines.append(f"  {k:<16}{_h(r['params'][k]):>12}{_h(r['active'][k]):>16}")
    lines += [
        f"  {'TOTAL':<16}{_h(r['total_params']):>12}{_h(r['active_params']):>16}",
        f"  exact: total {r['total_params']:,}  active {r['active_params']:,}",
        f"  sparsity: {r['sparsity']:.2%} of parameters idle per token "
        f"(routed experts: {r['routed_sparsity']:.2%})",
        f"  training memory: {_bytes(r['training_bytes']['total'])} before activations "
        "(weights + gradients + AdamW moments)",
        "",
    ]
    c = r["cache"]
    lines += [
        f"  MLA latent cache: {c['mla_latent_bytes_per_token']:,} B/token (bf16"
        + (
            f"; {c['mla_shared_key_bytes_per_token']:,} of them the shared key part)"
            if c["mla_shared_key_bytes_per_token"]
            else ")"
        ),
        f"  KDA state: {_bytes(c['kda_state_bytes_per_sequence'])} per sequence "
        "(fp32 states + bf16 conv tails, constant in context)",
        f"  full MHA of the same width: {c['full_mha_kv_bytes_per_token']:,} B/token (bf16 K+V)",
        f"  {'context':<9}{'hybrid cache':>16}{'full MHA KV':>16}{'MHA / hybrid':>14}",
    ]
    for n, v in c["contexts"].items():
        lines.append(
            f"  {n:<9}{_bytes(v['hybrid_bytes']):>16}{_bytes(v['full_mha_bytes']):>16}{v['ratio']:>13.1f}x"
        )
    vis = r.get("vision")
    if vis:
        lines += [
            "",
            f"  vision: {vis['encoder']} encoder, {_h(r['params']['vision'])} parameters "
            "(all of them run for each image patch, none for a text token)",
            f"  {vis['patch_size']}-px patches, images up to {vis['max_image_side']} px a side "
            f"(≤ {vis['max_patches']:,} patches), "
            f"~{_h(vis['encoder_flops_per_patch'])} FLOPs per patch to encode",
            f"  {'image':<22}{'resized':>12}{'tokens':>10}",
        ]
        for name, t in vis["image_tokens"].items():
            lines.append(f"  {name:<22}{t['resized']:>12}{t['tokens']:>10,}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--preset", default=None, help="named preset: tiny, small or flagship (default: tiny)")
    g.add_argument("--config", default=None, help="path to a config.json (a model directory's config)")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    g = parser.add_argument_group("cluster mapping")
    g.add_argument(
        "--parallel",
        metavar="dp_shard=A,ep=B,cp=C",
        help="also report memory per device, EP all-to-all bytes per token and the CP degree for 1M "
        "tokens on dp_shard·ep·cp devices (missing degrees are 1)",
    )
    g.add_argument("--seq-len", type=int, default=1 << 20, help="window tokens for --parallel (default 1M)")
    g.add_argument(
        "--device-memory", type=float, default=80.0, help="GiB per device for the CP search (default 80)"
    )
    parser.add_argument(
        "--quantize",
        choices=QUANT_MODES,
        default=None,
        help="also report the weight bytes after weight-only quantization (builds the model on 'meta')",
    )


def run(args: argparse.Namespace) -> int:
    if args.config:
        cfg, name = ModelConfig.load(args.config), args.config
    else:
        name = args.preset or "tiny"
        cfg = preset(name)
    r = report(cfg)
    dims = ParallelDims.parse(args.parallel) if args.parallel else None  # a ConfigError exits 2
    if dims is not None:
        r["parallel"] = plan(
            cfg, r["params"], r["cache"], dims, args.seq_len, int(args.device_memory * 2**30)
        )
    text = format_report(r, name)
    if dims is not None:
        text += "\n\n" + format_plan(r["parallel"], cfg)
    if args.quantize:
        r["weights"] = weight_footprint(cfg, args.quantize)
        text += "\n" + format_weights(r["weights"], args.quantize)
    print(json.dumps({"name": name, **r}, indent=2) if args.json else text)
    return 0


def format_weights(w: dict[str, Any], mode: str) -> str:
    q = w[mode]
    return "\n".join(
        [
            f"  weights ({w['dtype']}): {_bytes(w['bytes'])}",
            f"  weights --quantize {mode}: {_bytes(q['total'])} ({w['ratio']:.1%}): "
            f"{_bytes(q['quantized'])} packed + scales, {_bytes(q['float'])} kept in {w['dtype']} "
            "(embeddings, LM head, routers, MLA kv_up, norms, biases)",
        ]
    )
