"""Scale-out benchmark: one training step on 1 process vs 2 gloo processes, for each parallelism.

Layouts: 1 process; 2 processes with dp_shard = 2 (FSDP2, each rank half the windows), ep = 2 (experts
split, each rank half the windows; at the config's latent ratio α and at α = 1 and 4), cp = 2 (each
rank half of every packed row). Same seed and global batch everywhere. Reported per layout: median
step time (forward, backward, global gradient clipping, AdamW, balancer sync) and the bytes handed to
collectives per step on rank 0, counted by wrapping the calls FSDP2, the trainer (``torch.distributed``)
and EP/CP (``_functional_collectives``, forward calls: their backward sends as much again) make: each
call's input tensor bytes, by operation. The first loss of each layout is reported too: the layouts
train the same model on the same batch (α changes the model, so its rows have their own).

    python -m bench.distributed            # d_model 256, 8 windows of 256 tokens (EP payload: ℓ = d/α)
    python -m bench.distributed --quick    # tiny sizes, a few steps (seconds)

On a CPU machine the processes share its cores, so 2 processes are not faster here: the point is the
measured communication and that the layouts agree; GPU scaling is for a GPU run.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import socket
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
import torch.nn.functional as F

from bench.common import markdown_table, write_results
from longmoe.config import IGNORE_INDEX, FFNConfig, ModelConfig
from longmoe.data.batch import Batch
from longmoe.data.packing import Window, collate
from longmoe.distributed import parallel_dims
from longmoe.distributed.parallel_dims import ParallelDims, init_distributed, rank, teardown, world_size
from longmoe.distributed.parallelize import parallelize
from longmoe.distributed.reduce import all_reduce_sum, clip_grad_norm_, sync_balance_stats
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.train.sharding import context_part, shard_batch

# collective -> the argument holding what this rank contributes (FSDP2 in torch 2.13 calls the *_single
# forms, the trainer all_reduce); the bytes counted are that tensor's
COUNTED = {
    "all_gather_single": "input_tensor",
    "reduce_scatter_single": "input",
    "all_gather_into_tensor": "input_tensor",
    "reduce_scatter_tensor": "input",
    "all_reduce": "tensor",
    "broadcast": "tensor",
    "all_to_all_single": "input",
}
FUNCOL = {"all_gather_single_autograd": "self", "all_to_all_single_autograd": "self"}
# (name, dims, latent ratio α or None for the config's)
LAYOUTS = (
    ("1 process", ParallelDims(1, 1, 1), None),
    ("dp_shard=2", ParallelDims(2, 1, 1), None),
    ("ep=2", ParallelDims(1, 2, 1), None),
    ("ep=2, α=1", ParallelDims(1, 2, 1), 1),
    ("ep=2, α=4", ParallelDims(1, 2, 1), 4),
    ("cp=2", ParallelDims(1, 1, 2), None),
)


def model_config(quick: bool, alpha: int | None = None) -> ModelConfig:
    d, f = (64, 32) if quick else (256, 128)
    return preset("tiny").replace(
        vocab_size=1024, d_model=d, n_layers=4, kda_heads=2, kda_head_dim=d // 4, kda_gate_rank=16,
        mla_heads=2, mla_head_dim=d // 4, mla_v_head_dim=d // 4, mla_q_lora_rank=d // 2,
        mla_kv_lora_rank=d // 4, attn_res_blocks=2,
        ffn=FFNConfig(kind="moe", dense_hidden=2 * d, n_experts=8, top_k=2, n_shared=1,
                      latent_ratio=alpha or 2, expert_hidden=f, shared_hidden=d, first_k_dense=1),
    )  # fmt: skip


def global_batch(n_windows: int, window: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    ws = []
    for _ in range(n_windows):
        ids = torch.randint(0, vocab, (window + 1,), generator=g).tolist()
        ws.append(Window(ids[:window], ids[1:], [window]))
    return collate(ws)


class CommCounter:
    """Wraps ``torch.distributed`` collectives to count calls and input bytes per operation."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.on = False

    def install(self) -> None:
        for mod, table in ((dist, COUNTED), (funcol, FUNCOL)):
            for name, arg in table.items():
                if hasattr(mod, name):
                    setattr(mod, name, self._wrap(name, arg, getattr(mod, name)))

    def _wrap(self, name: str, arg: str, orig: Callable) -> Callable:
        sig = inspect.signature(orig)

        @functools.wraps(orig)
        def counted(*args: object, **kwargs: object) -> object:
            if self.on:
                t = sig.bind(*args, **kwargs).arguments.get(arg)
                if isinstance(t, torch.Tensor):
                    self.calls[name] += 1
                    self.bytes[name] += t.numel() * t.element_size()
            return orig(*args, **kwargs)

        return counted

    def reset(self) -> None:
        self.calls.clear()
        self.bytes.clear()


def run_layout(args: argparse.Namespace, out: Path, dims: ParallelDims, alpha: int | None, tag: str) -> None:
    """One process of a layout: time ``args.steps`` steps, count the bytes of the last one."""
    torch.set_num_threads(1)
    counter = CommCounter()
    counter.install()
    world = world_size()
    torch.manual_seed(0)
    cfg = model_config(args.quick, alpha)
    model = LongMoE(cfg)
    data_rank, cp_rank = 0, 0
    if world > 1:
        mesh = dims.build_mesh("cpu")
        parallelize(model, dims, mesh)
        data_rank, cp_rank = parallel_dims.data_rank(mesh), mesh["cp"].get_local_rank()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    full = global_batch(args.windows, args.window, cfg.vocab_size)
    b = shard_batch(full, [args.window] * args.windows, data_rank, dims.data_degree)
    b = context_part(b, cp_rank, dims.cp)

    def step() -> float:
        out_ = model(b.input_ids, cu_seqlens=b.cu_seqlens)
        n = int((b.labels != IGNORE_INDEX).sum())
        ce = F.cross_entropy(out_.logits.float().view(-1, cfg.vocab_size), b.labels.view(-1), reduction="sum")
        (total,) = all_reduce_sum([float(n)])
        (ce * world / total).backward()
        if world > 1:
            clip_grad_norm_(model.parameters(), 1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync_balance_stats(model.moe_layers())
        for m in model.moe_layers():
            m.update_balance()
        (s,) = all_reduce_sum([float(ce.detach())])
        return s / total

    first_loss = step()  # warmup (and the first loss, to check the layouts agree)
    times = []
    for i in range(args.steps):
        counter.on = i == args.steps - 1  # count the last step
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    counter.on = False
    if rank() == 0:
        res = {
            "world": world,
            "step_s": statistics.median(times),
            "first_loss": first_loss,
            "tokens_per_step": args.windows * args.window,
            "comm_calls": dict(counter.calls),
            "comm_bytes": dict(counter.bytes),
            "comm_bytes_total": sum(counter.bytes.values()),
        }
        (out / f"{tag}.json").write_text(json.dumps(res))


def _worker(r: int, world: int, port: int, args: argparse.Namespace, out: str, layout: int) -> None:
    _, dims, alpha = LAYOUTS[layout]
    if world == 1:  # the one-process trainer: no process group at all
        run_layout(args, Path(out), dims, alpha, f"layout{layout}")
        return
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r)
    )
    init_distributed("cpu")
    try:
        run_layout(args, Path(out), dims, alpha, f"layout{layout}")
    finally:
        teardown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, a few steps")
    p.add_argument("--steps", type=int, help="timed steps per layout")
    p.add_argument("--windows", type=int, help="windows in the global batch")
    p.add_argument("--window", type=int, help="tokens per window")
    args = p.parse_args()
    args.steps = args.steps or (3 if args.quick else 10)
    args.windows = args.windows or (4 if args.quick else 8)
    args.window = args.window or (64 if args.quick else 256)
    with tempfile.TemporaryDirectory() as tmp:
        for i, (_, dims, _) in enumerate(LAYOUTS):
            w = dims.world_size
            mp.spawn(_worker, args=(w, _free_port(), args, tmp, i), nprocs=w, join=True)
        res = {
            name: json.loads((Path(tmp) / f"layout{i}.json").read_text())
            for i, (name, _, _) in enumerate(LAYOUTS)
        }
    base = res["1 process"]["step_s"]
    rows = [
        [
            name,
            r["step_s"] * 1e3,
            base / r["step_s"],
            r["comm_bytes_total"] / 2**20,
            ", ".join(f"{k} {v / 2**20:.3g} MiB ×{r['comm_calls'][k]}" for k, v in r["comm_bytes"].items())
            or "-",
            r["first_loss"],
        ]
        for name, r in res.items()
    ]
    header = [
        "layout (2 processes unless 1)",
        "step ms",
        "speed vs 1",
        "comm MiB/step (rank 0)",
        "by collective",
        "first loss",
    ]
    table = markdown_table(header, rows)
    name = "distributed_quick" if args.quick else "distributed"
    payload = {"config": {k: getattr(args, k) for k in ("steps", "windows", "window", "quick")}, "runs": res}
    write_results(name, payload, table, update_readme=not args.quick)


if __name__ == "__main__":
    main()
