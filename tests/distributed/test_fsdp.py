"""FSDP2 on 2 gloo ranks equals one process: same losses for 5 AdamW steps (fp32, <= 1e-5), same weights,
same balancer bias on every rank; with activation checkpointing too; DCP round trips 2 -> 1 and 1 -> 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from longmoe.config import IGNORE_INDEX, FFNConfig
from longmoe.data.packing import Window, collate
from longmoe.distributed.checkpoint import full_model_state, load_full, load_sharded, save_sharded
from longmoe.distributed.parallel_dims import ParallelDims, rank, world_size
from longmoe.distributed.parallelize import parallelize
from longmoe.distributed.reduce import all_reduce_sum, clip_grad_norm_, sync_balance_stats
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.train.optim import param_groups
from tests.helpers.launch import run_ranks

STEPS, WINDOWS, WINDOW = 5, 4, 32


def small_config():
    return preset("tiny").replace(
        vocab_size=128, d_model=32, n_layers=4, kda_heads=2, kda_head_dim=8, kda_gate_rank=8,
        mla_heads=2, mla_head_dim=8, mla_v_head_dim=8, mla_q_lora_rank=16, mla_kv_lora_rank=8,
        attn_res_blocks=2,
        ffn=FFNConfig(kind="moe", dense_hidden=64, n_experts=4, top_k=2, n_shared=1, latent_ratio=2,
                      expert_hidden=16, shared_hidden=32, first_k_dense=1),
    )  # fmt: skip


def global_batch(step: int) -> list[Window]:
    g = torch.Generator().manual_seed(100 + step % 2)  # two batches, alternating: learnable
    out = []
    for _ in range(WINDOWS):
        ids = torch.randint(0, 128, (WINDOW + 1,), generator=g).tolist()
        labels = ids[1:]
        labels[WINDOW // 2 - 1] = IGNORE_INDEX  # a document boundary in the middle
        out.append(Window(ids[:WINDOW], labels, [WINDOW // 2, WINDOW // 2]))
    return out


def build(ac: bool = False) -> tuple[LongMoE, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = LongMoE(small_config())
    if world_size() > 1:
        dims = ParallelDims(dp_shard=world_size())
        parallelize(model, dims, dims.build_mesh("cpu"), activation_checkpointing=ac)
    return model, torch.optim.AdamW(param_groups(model, 0.1), lr=3e-3)


def train_steps(model, opt, steps: range) -> list[float]:
    """The trainer's sharded step: each rank its windows, CE weighted by its share of the target tokens."""
    losses = []
    for step in steps:
        b = collate(global_batch(step)[rank() :: world_size()])
        out = model(b.input_ids, cu_seqlens=b.cu_seqlens)
        n = int((b.labels != IGNORE_INDEX).sum())
        ce_sum = F.cross_entropy(out.logits.view(-1, 128).float(), b.labels.view(-1), reduction="sum")
        (total,) = all_reduce_sum([float(n)])
        (ce_sum * world_size() / total).backward()
        clip_grad_norm_(model.parameters(), 1.0)  # the gradient norm is 2-4: clipping is active
        opt.step()
        opt.zero_grad()
        sync_balance_stats(model.moe_layers())
        for m in model.moe_layers():
            m.update_balance()
        (s,) = all_reduce_sum([float(ce_sum.detach())])
        losses.append(s / total)
    return losses


def _worker(r: int, world: int, out: str) -> None:
    """Everything the tests below check, in one 2-rank launch (process start-up dominates the cost)."""
    res = {}
    for ac in (False, True):
        model, opt = build(ac)
        res[f"losses_ac{int(ac)}"] = train_steps(model, opt, range(STEPS))
        if not ac:
            res["state"] = full_model_state(model)
            res["bias"] = [m.bias.tolist() for m in model.moe_layers()]
    model, opt = build()  # 2 -> 1: save a sharded checkpoint after 2 steps, note the losses after it
    train_steps(model, opt, range(2))
    save_sharded(model, opt, Path(out) / "two")
    res["after_save"] = train_steps(model, opt, range(2, STEPS))
    model, opt = build()  # 1 -> 2: resume the one-process checkpoint the parent wrote
    full = torch.load(f"{out}/one.pt")
    load_full(model, opt, full["model"], full["optim"])
    res["one_to_two"] = train_steps(model, opt, range(2, STEPS))
    torch.save(res, f"{out}/rank{r}.pt")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The one-process reference (5 steps, and a checkpoint after 2) and the 2-rank results."""
    out = tmp_path_factory.mktemp("fsdp")
    model, opt = build()
    ref = train_steps(model, opt, range(2))
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, out / "one.pt")
    ref += train_steps(model, opt, range(2, STEPS))
    run_ranks(_worker, str(out))
    return {
        "ref": ref,
        "model": model,
        "out": out,
        "ranks": [torch.load(out / f"rank{r}.pt") for r in (0, 1)],
    }


def close(a: list[float], b: list[float]) -> bool:
    return max(abs(x - y) for x, y in zip(a, b)) <= 1e-5


@pytest.mark.parametrize("ac", [0, 1], ids=["fsdp", "fsdp+activation-checkpointing"])
def test_two_rank_losses_equal_one_process(runs, ac):
    ref, got = runs["ref"], runs["ranks"][0][f"losses_ac{ac}"]
    assert close(got, ref), (got, ref)
    assert got == runs["ranks"][1][f"losses_ac{ac}"]  # every rank logs the same (all-reduced) loss
    assert ref[-1] < ref[0]  # it trains


def test_two_rank_weights_and_balancer_bias_equal_one_process(runs):
    r0, r1 = runs["ranks"]
    model = runs["model"]
    assert r0["bias"] == r1["bias"] == [m.bias.tolist() for m in model.moe_layers()]
    assert any(any(x != 0 for x in b) for b in r0["bias"])  # the balancer moved
    for k, v in model.state_dict().items():
        torch.testing.assert_close(r0["state"][k], v, atol=1e-5, rtol=1e-4, msg=k)


def test_dcp_two_ranks_to_one_process(runs):
    """A checkpoint sharded over 2 ranks resumes in one process (no process group) with equal losses."""
    model, opt = build()
    load_sharded(model, opt, runs["out"] / "two")
    one = train_steps(model, opt, range(2, STEPS))
    assert close(one, runs["ranks"][0]["after_save"]), (one, runs["ranks"][0]["after_save"])


def test_dcp_one_process_to_two_ranks(runs):
    """A one-process checkpoint (full weights, optimizer state by position) resumes on 2 ranks."""
    assert close(runs["ranks"][0]["one_to_two"], runs["ref"][2:])
