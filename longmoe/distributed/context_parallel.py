"""Context parallelism (docs/design.md §1.1, §1.2, §5): one sequence split into contiguous parts over ranks.

Rank ``r`` of the ``P`` context-parallel ranks holds tokens ``[r·T, (r+1)·T)`` of a sequence of ``P·T``
tokens. Everything per token (embeddings, norms, FFN/MoE, attention residuals, the head) runs locally;
only the two token mixers talk to other ranks. ``apply_context_parallel`` replaces their ``forward`` on
the instance (parameters and state-dict keys untouched) and returns the ``ContextParallel`` that holds
the layout of the current call.

**KDA** (S = per-head state ``[K, V]``). Every token's update is affine in the state,
``S_t = (I − β_t k_t k_tᵀ) Diag(e^{g_t}) S_{t−1} + β_t k_t v_tᵀ``, so a rank's part maps its incoming
state ``S_in`` to ``S_out = M·S_in + B`` (``M`` is ``K×K``). State columns evolve independently, so one
call of the chunk operator with values ``[v | 0]`` (``V + K`` columns) from the initial state ``[0 | I]``
yields both at once: the final state is ``[B | M]``, and the extra output columns are
``scale·M_{≤t}ᵀ q_t``, which turn the local outputs into the true ones without a second pass:
``o_t = o_t[:V] + S_inᵀ · o_t[V:]``. Per layer: one all-gather of the conv halo (the last
``conv_size − 1`` conv inputs, so each rank's short conv sees its predecessor's tail), one all-gather of
the ``[B | M]`` summaries, then each rank folds its predecessors' maps (``S ← M_j S + B_j`` from 0) to
get ``S_in``. With packed documents a document start resets the state, so a part containing one has
``M = 0`` (its identity columns start at zero there); the conv masks taps across document starts.

**MLA**. One all-gather of the cache rows ``[c | k_r]`` (``d_c + d_r`` numbers per token: the latent and
the shared key part, if any); each rank expands keys and
values for the tokens up to its last one (from the start of its first token's document when packed)
and attends causally with its query offset, never across documents.

Both collectives are PyTorch's autograd-aware functional collectives (the backward of an all-gather is
a reduce-scatter), so outputs and gradients equal the single-process model. Caches are not supported
(training and prefill of one long sequence).

With ``cu_seqlens`` the model is called with the *global* offsets of the whole ``P·T``-token sequence
(the same on every rank); the pre-hook installed on a ``LongMoE`` records them and hands the model
its local offsets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

from longmoe.cache import KDAState, MLAState, Packing
from longmoe.distributed.expert_parallel import MeshLike, as_mesh
from longmoe.layers.kda import KDALayer
from longmoe.layers.mla import MLALayer
from longmoe.model import LongMoE
from longmoe.ops.kda import kda_chunk

_CU_SEQLENS_ARG = 3  # LongMoE.forward(input_ids, labels, cache, cu_seqlens, use_cache)


@dataclass
class Layout:
    """This rank's part of the sequence in the current call."""

    start: int  # global index of the first local token
    length: int  # T, the same on every rank
    packing: Packing | None  # documents of the whole sequence (global offsets), or None
    local_cu: torch.Tensor | None  # [n+1] the document offsets inside the local part

    @property
    def continues(self) -> bool:
        """Whether the first local token continues a document (or sequence) from the previous rank."""
        if self.start == 0:
            return False
        return self.packing is None or int(self.packing.doc_pos[self.start]) > 0


class ContextParallel:
    """The context-parallel group of a model and the layout of its current call (module docstring)."""

    def __init__(self, mesh: MeshLike, device: torch.device) -> None:
        self.mesh = as_mesh(mesh, device)
        self.group = self.mesh.get_group()
        self.size, self.rank = self.mesh.size(), self.mesh.get_local_rank()
        self.layout: Layout | None = None

    def shard(self, length: int, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor | None:
        """Record the layout of a call whose local part has ``length`` tokens; returns the local offsets.

        ``cu_seqlens``: global document offsets ``[0, …, P·length]`` of the whole sequence, or None.
        """
        start = self.rank * length
        if cu_seqlens is None:
            self.layout = Layout(start, length, None, None)
            return None
        bounds = [int(b) for b in cu_seqlens.tolist()]
        total = self.size * length
        if bounds[0] != 0 or bounds[-1] != total or any(b < a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(
                f"cu_seqlens: under context parallel, expected the global offsets [0, ..., {total}] "
                f"({self.size} ranks x {length} tokens), got {bounds[:8]}"
            )
        inner = sorted({b - start for b in bounds if start < b < start + length})
        local = torch.tensor([0, *inner, length], dtype=torch.long, device=cu_seqlens.device)
        self.layout = Layout(start, length, Packing(cu_seqlens.long()), local)
        return local

    def _layout(self, T: int, state: object) -> Layout:
        if state is not None:
            raise ValueError("context parallel: a cache is not supported (training and prefill only)")
        lay = self.layout
        if lay is None or lay.length != T:
            raise ValueError(
                f"context parallel: no layout for a local part of {T} tokens; call shard() first "
                "(a LongMoE does so in its forward pre-hook)"
            )
        return lay

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """All-gather along a new leading rank dimension: ``[...]`` -> ``[P, ...]`` (autograd-aware).

        The backward of a gather is a collective, which runs on a rank only if the gathered
        tensor reaches that rank's outputs, and in the order its autograd reaches it. So every rank
        consumes its gathered tensors through the same operations (rank-dependent parts are masked by
        0/1 factors or replaced by identities, never skipped): the backward collectives then match.
        """
        out = funcol.all_gather_single_autograd(x.contiguous(), 0, self.group)
        return out.view(self.size, *x.shape)

    # ------------------------------------------------------------------------------------------ KDA
    def kda_forward(
        self, layer: KDALayer, x: torch.Tensor, state: KDAState | None = None, packing: Packing | None = None
    ) -> torch.Tensor:
        """``KDALayer.forward`` on this rank's part ``x [B, T, d]`` of the sequence (``packing``, the
        local one the model passes, is superseded by the layout recorded by ``shard``)."""
        B, T, _ = x.shape
        lay = self._layout(T, state)
        H, K, V, W = layer.H, layer.K, layer.V, layer.conv_size
        if W > 1 and T < W - 1:
            raise ValueError(f"context parallel: each rank needs at least conv_size - 1 = {W - 1} tokens")
        # conv halo: the previous rank's last W-1 pre-conv q|k|v inputs (zeros on rank 0, still taken
        # from the gathered tensor: see _gather)
        halo = None
        if W > 1:
            w_qkv = layer.in_proj.weight[: layer.qkv_dim]  # [C, d]
            tails = self._gather(F.linear(x[:, T - (W - 1) :], w_qkv))  # [P, B, W-1, C]
            halo = tails[(self.rank - 1) % self.size] * float(self.rank > 0)
        conv_packing = None
        if lay.packing is not None:  # conv taps masked by the position inside the (global) document
            conv_packing = Packing(lay.local_cu)
            conv_packing.doc_pos = lay.packing.doc_pos[lay.start : lay.start + T]
        q, k, v, g, beta, out_gate, _ = layer.features(x, halo, conv_packing)
        # one chunk pass from [0 | I] with values [v | 0]: outputs [o | scale·M_{≤t}ᵀq], final [B | M]
        n_slots = B if lay.local_cu is None else lay.local_cu.numel() - 1
        init = torch.zeros(n_slots, H, K, V + K, dtype=torch.float32, device=x.device)
        if lay.continues:  # only the first (continuing) document carries the incoming state
            rows = slice(None) if lay.local_cu is None else slice(0, 1)
            init[rows, :, :, V:] = torch.eye(K, device=x.device)
        v_ext = torch.cat([v, v.new_zeros(B, T, H, K)], dim=-1)  # [B, T, H, V+K]
        with torch.autocast(device_type=x.device.type, enabled=False):
            o_ext, final = kda_chunk(
                q,
                k,
                v_ext,
                g.to(q.dtype),
                beta.to(q.dtype),
                initial_state=init.to(torch.float64) if q.dtype == torch.float64 else init,
                output_final_state=True,
                cu_seqlens=lay.local_cu,
                chunk_size=layer.chunk_size,
                intra=layer.intra,  # the log-space path for unbounded (Kimi-Linear) gates
            )  # [B, T, H, V+K], [n_slots, H, K, V+K]
        summary = final if lay.local_cu is None else final[-1:]  # the part's [B | M]: [b, H, K, V+K]
        maps = self._gather(summary)  # [P, b, H, K, V+K]
        # S_in = fold of the predecessors' maps from the zero state; the other ranks' maps are replaced by
        # the identity map [0 | I] so every rank runs the same graph (see _gather)
        ident = torch.cat([summary.new_zeros(K, V), torch.eye(K, dtype=summary.dtype, device=x.device)], -1)
        before = (torch.arange(self.size, device=x.device) < self.rank).view(-1, 1, 1, 1, 1)
        maps = torch.where(before, maps, ident)  # [P, b, H, K, V+K]
        s_in = torch.zeros_like(summary[..., :V])  # [b, H, K, V]
        for j in range(self.size):
            s_in = maps[j, ..., V:] @ s_in + maps[j, ..., :V]  # S ← M_j S + B_j
        # o_t = o_t[:V] + S_inᵀ (scale·M_{≤t}ᵀ q_t); the extra columns are 0 where no state comes in
        corr = torch.einsum("bthk,bhkv->bthv", o_ext[..., V:].to(s_in.dtype), s_in)  # [B, T, H, V]
        return layer.output(o_ext[..., :V] + corr.to(o_ext.dtype), out_gate)

    # ------------------------------------------------------------------------------------------ MLA
    def mla_forward(
        self,
        layer: MLALayer,
        x: torch.Tensor,
        state: MLAState | None = None,
        seq_lens: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """``MLALayer.forward`` on this rank's part ``x [B, T, d]``: gathered cache rows, offset causal mask
        (``packing`` is superseded by the recorded layout, as for KDA)."""
        B, T, _ = x.shape
        lay = self._layout(T, state)
        q, c, gate = layer.project(x)  # [B, H, T, Dk], [B, T, d_c + d_r], [B, T, H*Dv]
        c_all = self._gather(c).transpose(0, 1).reshape(B, self.size * T, -1)  # [B, P·T, d_c + d_r]
        lo, hi = lay.start, lay.start + T
        k0 = 0 if lay.packing is None else int(lay.packing.cu_seqlens[lay.packing.doc_id[lo]])
        k, v = layer.expand_kv(c_all[:, k0:hi])  # [B, H, hi-k0, Dk], [B, H, hi-k0, Dv]
        pos_q = torch.arange(lo, hi, device=x.device)
        pos_k = torch.arange(k0, hi, device=x.device)
        # log-length scaling by each query's position in its sequence (its document's, when packed)
        q = layer.length_scaled(q, pos_q if lay.packing is None else lay.packing.doc_pos[lo:hi])
        mask = pos_k[None, :] <= pos_q[:, None]  # [T, hi-k0] causal with the query offset
        if lay.packing is not None:
            doc = lay.packing.doc_id
            mask = mask & (doc[pos_k][None, :] == doc[pos_q][:, None])
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=layer.scale)  # [B, H, T, Dv]
        return layer.output(o, gate)


def apply_context_parallel(model: nn.Module, cp_mesh: MeshLike) -> ContextParallel:
    """Split sequences over ``cp_mesh`` (a 1-D ``DeviceMesh`` or a ``ProcessGroup``) for every KDA and MLA
    layer of ``model`` (changed in place). On a ``LongMoE`` a forward pre-hook records each call's layout
    (``cu_seqlens`` are then the global offsets); on a bare layer call ``shard`` before each forward.
    """
    device = next(model.parameters()).device
    cp = ContextParallel(cp_mesh, device)
    for m in model.modules():
        if isinstance(m, KDALayer):
            m.forward = partial(cp.kda_forward, m)
        elif isinstance(m, MLALayer):
            m.forward = partial(cp.mla_forward, m)
    if isinstance(model, LongMoE):
        model.register_forward_pre_hook(partial(_shard_call, cp), with_kwargs=True)
    return cp


def _shard_call(cp: ContextParallel, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``LongMoE`` pre-hook: record the layout, swap the global ``cu_seqlens`` for the local offsets."""
    input_ids = args[0] if args else kwargs["input_ids"]
    if len(args) > _CU_SEQLENS_ARG:
        cu = args[_CU_SEQLENS_ARG]
        args = (*args[:_CU_SEQLENS_ARG], cp.shard(input_ids.shape[1], cu), *args[_CU_SEQLENS_ARG + 1 :])
    else:
        cu = kwargs.get("cu_seqlens")
        local = cp.shard(input_ids.shape[1], cu)
        if cu is not None:
            kwargs = {**kwargs, "cu_seqlens": local}
    return args, kwargs
