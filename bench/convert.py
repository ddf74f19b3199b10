"""``longmoe convert`` at a real size: time and peak memory of both directions on a random checkpoint.

A random Kimi-Linear checkpoint is written straight to safetensors shards (the layout transformers
saves, bf16 like the released models, ~100 MB per shard) from the tensor map, without building a
model; then ``longmoe convert --from-hf`` and ``--to-hf`` run as subprocesses, each printing its wall
time and peak RSS. The conversion streams, so the peak should stay near the interpreter's baseline plus
one layer's experts, far below the checkpoint size.

    python -m bench.convert [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.common import markdown_table, write_results
from longmoe.interop.kimi_config import config_from_hf
from longmoe.interop.kimi_map import source_map

SHARD_BYTES = 100 << 20


def hf_config(quick: bool) -> dict:
    """Kimi-Linear's layout (3:1 KDA:MLA, 1 dense layer first, grouped sigmoid routing, a shared expert,
    no q low rank) with Kimi-Linear-48B-A3B's MLA head geometry (kv_lora_rank 512, q/k heads 128 NoPE +
    64 shared key part under ``mla_use_nope``, v 128), at a width and depth this machine converts in
    under a minute (the real hidden 2304 and vocabulary 163840 would be several GB even at 4 layers)."""
    layers = 4 if quick else 8
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "vocab_size": 32000,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "moe_intermediate_size": 512,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "mla_use_nope": True,
        "v_head_dim": 128,
        "num_experts": 8 if quick else 32,
        "num_experts_per_token": 4,
        "num_expert_group": 4,
        "topk_group": 2,
        "num_shared_experts": 1,
        "routed_scaling_factor": 2.446,
        "first_k_dense_replace": 1,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "linear_attn_config": {
            "kda_layers": [i + 1 for i in range(layers) if i % 4 != 3],
            "full_attn_layers": [i + 1 for i in range(layers) if i % 4 == 3],
            "head_dim": 128,
            "num_heads": 8,
            "short_conv_kernel_size": 4,
        },
    }


def write_random_checkpoint(d: Path, hf: dict) -> tuple[int, int]:
    """Shards of random bf16 tensors + the index, as ``save_pretrained`` lays them out; (params, bytes)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(hf, indent=2))
    shapes = {name: shape for name, (_, shape) in source_map(config_from_hf(hf)).items()}
    gen = torch.Generator().manual_seed(0)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    files, size, params = [], 0, 0

    def flush() -> None:
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(d / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        files.append(name)
        shard.clear()

    for name, shape in shapes.items():
        fp32 = name.endswith(("e_score_correction_bias", "gate.weight", "dt_bias"))
        t = (torch.randn(shape, generator=gen) * 0.02).to(torch.float32 if fp32 else torch.bfloat16)
        shard[name] = t
        params += t.numel()
        size += t.numel() * t.element_size()
        if sum(x.numel() * x.element_size() for x in shard.values()) >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    index = {"metadata": {"total_size": size}, "weight_map": weight_map}
    (d / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return params, size


def convert(*args: str) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "longmoe", "convert", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(p.stderr)
    m = re.search(r"peak RSS (\d+) MB", p.stdout)
    return {
        "wall_s": time.perf_counter() - t0,
        "peak_rss_mb": int(m.group(1)) if m else None,
        "out": p.stdout,
    }


def baseline_rss_mb() -> int:
    code = (
        "import resource, longmoe.interop.cli as c; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    )
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout) // 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller checkpoint (4 layers, 8 experts)")
    ap.add_argument("--out", type=Path, default=None, help="work directory (default: a temporary one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        hf = hf_config(args.quick)
        t0 = time.perf_counter()
        params, size = write_random_checkpoint(root / "hf", hf)
        gen_s = time.perf_counter() - t0
        a = convert("--from-hf", str(root / "hf"), "--out", str(root / "lm"))
        b = convert("--to-hf", str(root / "lm"), "--out", str(root / "back"))
        base = baseline_rss_mb()
    rows = [
        [
            "random checkpoint",
            f"{params / 1e6:.0f}M params",
            f"{size / 2**20:.0f} MB bf16",
            f"{gen_s:.1f}",
            "-",
        ],
        ["--from-hf", "", "", f"{a['wall_s']:.1f}", a["peak_rss_mb"]],
        ["--to-hf", "", "", f"{b['wall_s']:.1f}", b["peak_rss_mb"]],
        ["python + longmoe imported (baseline)", "", "", "-", base],
    ]
    table = markdown_table(["step", "model", "size", "wall s", "peak RSS MB"], rows)
    payload = {
        "config": hf,
        "params": params,
        "bytes": size,
        "from_hf": a,
        "to_hf": b,
        "baseline_rss_mb": base,
    }
    write_results("convert", payload, table, update_readme=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
