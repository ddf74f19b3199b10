"""Context parallel over gloo ranks equals one process: KDA and MLA layers and the whole model, forward
and backward, with and without packed documents (including documents that cross a rank boundary)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from longmoe.cache import Packing
from longmoe.config import FFNConfig, ModelConfig
from longmoe.distributed.context_parallel import apply_context_parallel
from longmoe.distributed.expert_parallel import apply_expert_parallel
from longmoe.layers.kda import KDALayer
from longmoe.layers.mla import MLALayer
from longmoe.model import LongMoE
from tests.helpers.launch import run_ranks
from tests.helpers.models import small_cfg

T = 21  # tokens per rank: not a multiple of the chunk size (8 below)
TOL = dict(atol=2e-5, rtol=2e-5)
# whole-model gradients sum over every layer in a rank-dependent order: float32 rounding reaches a few
# 1e-5 on some CPUs (a wrong gradient is off by 1e-2 or more)
MODEL_GRAD_TOL = dict(atol=1e-4, rtol=1e-4)


def _close(got: torch.Tensor, want: torch.Tensor, tol: dict, what: str) -> None:
    """``assert_close`` whose message keeps torch's mismatch report after ``what``."""
    torch.testing.assert_close(got, want, **tol, msg=lambda report: f"{what}: {report}")


def _cfg(**kw) -> ModelConfig:
    mla = dict(mla_heads=2, mla_q_lora_rank=16, mla_kv_lora_rank=12, mla_head_dim=8, mla_v_head_dim=8)
    return small_cfg("L", **{"kda_chunk_size": 8, **mla, **kw})


def _layouts(world: int) -> list[list[int] | None]:
    """None (one sequence) and packed documents: crossing every boundary, starting exactly on one,
    starting inside the first conv_size-1 tokens of a rank (the conv halo must be masked)."""
    n = world * T
    return [
        None,
        [0, 5, n - 3, n],  # one document spans every rank
        [0, T, n],  # a document starts exactly at the first boundary
        [0, 3, T + 2, T + 9, n],  # a start two tokens into rank 1; a short document inside it
    ]


def _build(kind: str) -> torch.nn.Module:
    """``"L"`` KDA, ``"M"`` MLA, ``"M+shared"`` MLA with a shared key part (``mla_shared_key_dim``),
    ``"M+logn"`` MLA with log-length scaling (``mla_logn_scale``)."""
    torch.manual_seed(0)
    if kind == "L":
        m = KDALayer(_cfg())
    else:
        m = MLALayer(_cfg(layer_pattern="M", mla_shared_key_dim=4 if kind == "M+shared" else 0,
                          mla_logn_scale=0.5 if kind == "M+logn" else 0.0))  # fmt: skip
    m.init_weights(0.3, 0.3)
    if kind == "L":
        with torch.no_grad():
            m.A.normal_(0.0, 0.5)
    return m


def _call(m: torch.nn.Module, x: torch.Tensor, packing: Packing | None) -> torch.Tensor:
    return m(x, None, packing) if isinstance(m, KDALayer) else m(x, None, None, packing)


def _grads_all_reduced(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every gradient summed over ranks: replicated parameters all-reduced; expert shards (DTensor),
    whose gradient expert parallelism already averages over the ranks, multiplied back by the world."""
    out = {}
    for name, p in m.named_parameters():
        if isinstance(p.grad, DTensor):
            out[name] = p.grad.to_local() * dist.get_world_size()
            continue
        g = p.grad.clone()
        dist.all_reduce(g)  # each rank holds its part's contribution
        out[name] = g
    return out


def _ref_grad(ref: torch.nn.Module, name: str, like: torch.Tensor, rank: int) -> torch.Tensor:
    g = ref.get_parameter(name).grad
    n = like.shape[0]
    return g if g.shape == like.shape else g[rank * n : (rank + 1) * n]  # an expert shard


def _layer_matches_one_process(rank: int, world: int, kind: str) -> None:
    B = 2
    for cu in _layouts(world):
        b = B if cu is None else 1
        g = torch.Generator().manual_seed(1)
        x = torch.randn(b, world * T, 32, generator=g)
        probe = torch.randn(b, world * T, 32, generator=g)
        cu_t = None if cu is None else torch.tensor(cu)
        ref = _build(kind)
        xr = x.clone().requires_grad_(True)
        y_ref = _call(ref, xr, None if cu_t is None else Packing(cu_t))
        (y_ref * probe).sum().backward()

        m = _build(kind)
        cp = apply_context_parallel(m, init_device_mesh("cpu", (world,)))
        part = slice(rank * T, (rank + 1) * T)
        local_cu = cp.shard(T, cu_t)
        xl = x[:, part].clone().requires_grad_(True)
        y = _call(m, xl, None if local_cu is None else Packing(local_cu))
        (y * probe[:, part]).sum().backward()
        msg = f"{kind} layout {cu}"
        torch.testing.assert_close(y, y_ref[:, part].detach(), **TOL, msg=msg)
        torch.testing.assert_close(xl.grad, xr.grad[:, part], **TOL, msg=msg)
        for name, gr in _grads_all_reduced(m).items():
            _close(gr, ref.get_parameter(name).grad, TOL, f"{msg}: {name}")


def test_kda_context_parallel_equals_one_process():
    """KDA on 2 ranks: outputs, input and parameter gradients equal the whole sequence in one process
    (state carried by the [B | M] affine maps, conv halo exchanged, document resets respected)."""
    run_ranks(_layer_matches_one_process, "L")


def test_kda_context_parallel_three_ranks_composes_maps():
    """On 3 ranks the last one folds two predecessor maps (S ← M_1 (M_0·0 + B_0) + B_1)."""
    run_ranks(_layer_matches_one_process, "L", world=3)


def test_mla_context_parallel_equals_one_process():
    """MLA on 2 ranks: gathered latents + offset causal mask equal one process, forward and backward."""
    run_ranks(_layer_matches_one_process, "M")


def test_mla_shared_key_context_parallel_equals_one_process():
    """The gathered cache rows carry the shared key part too: [c | k_r] per token, same results."""
    run_ranks(_layer_matches_one_process, "M+shared")


def test_mla_logn_scaling_context_parallel_equals_one_process():
    """Each rank scales its queries by their global positions (inside their document when packed)."""
    run_ranks(_layer_matches_one_process, "M+logn")


def _model_matches_one_process(rank: int, world: int) -> None:
    cfg = _cfg(
        n_layers=4,
        layer_pattern="LLLM",
        attn_res_blocks=2,
        ffn=FFNConfig(
            kind="moe",
            n_experts=4,
            top_k=2,
            n_shared=1,
            latent_ratio=2,
            expert_hidden=16,
            shared_hidden=16,
            dense_hidden=32,
            first_k_dense=1,
        ),
    )
    n = world * T
    for cu, ep in ((None, False), ([0, 7, T + 4, n], False), ([0, 7, T + 4, n], True)):
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, cfg.vocab_size, (1, n), generator=g)
        probe = torch.randn(1, n, cfg.vocab_size, generator=g)
        cu_t = None if cu is None else torch.tensor(cu)
        torch.manual_seed(0)
        ref = LongMoE(cfg)
        logits_ref = ref(ids, cu_seqlens=cu_t).logits
        (logits_ref * probe).sum().backward()

        torch.manual_seed(0)
        model = LongMoE(cfg)
        apply_context_parallel(model, dist.group.WORLD)
        if ep:  # the same ranks also share the experts (parallelize's order: CP, then EP)
            apply_expert_parallel(model, dist.group.WORLD)
        part = slice(rank * T, (rank + 1) * T)
        logits = model(ids[:, part], cu_seqlens=cu_t).logits  # global offsets; the hook localises them
        (logits * probe[:, part]).sum().backward()
        torch.testing.assert_close(logits, logits_ref[:, part].detach(), **TOL, msg=f"layout {cu}")
        for name, gr in _grads_all_reduced(model).items():
            want = _ref_grad(ref, name, gr, rank)
            _close(gr, want, MODEL_GRAD_TOL, f"{cu}, ep={ep}: {name}")


def test_model_context_parallel_equals_one_process():
    """The whole tiny hybrid model (KDA, MLA, MoE, attention residuals) with one sequence split over
    2 ranks: logits and every parameter gradient equal one process, with and without cu_seqlens, and
    with the same 2 ranks also expert-parallel."""
    run_ranks(_model_matches_one_process)


def _bad_calls_raise(rank: int, world: int) -> None:
    m = _build("L")
    cp = apply_context_parallel(m, dist.group.WORLD)
    x = torch.randn(1, T, 32)
    with pytest.raises(ValueError, match="call shard"):
        m(x)  # no layout recorded
    with pytest.raises(ValueError, match="global offsets"):
        cp.shard(T, torch.tensor([0, 5, T]))  # local offsets where global ones are expected
    cp.shard(T)
    with pytest.raises(ValueError, match="cache is not supported"):
        m(x, m.new_state(1, x.device, x.dtype))
    with pytest.raises(ValueError, match="conv_size - 1"):
        cp.shard(2)
        m(x[:, :2])


def test_context_parallel_rejects_bad_calls():
    """A missing layout, local offsets given as global ones, a cache, or parts shorter than the conv
    halo raise errors that say what to do."""
    run_ranks(_bad_calls_raise)
