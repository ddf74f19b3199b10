"""Routed GLU experts for decode-sized batches: a host loop over the chosen experts' weight views.

At decode a token picks ``k`` of ``E`` experts, and a step is bound by the bytes of weight it reads.
The padded dispatch (``dispatch.py``) gives *every* expert at least one padded row block, so its first
``bmm`` tier reads all ``E`` experts (``E/k`` times the bytes needed: 8× at 16 experts, top-2);
gathering the ``k`` experts' weights per pair (``gather.py``) reads them, writes a copy and reads that
again. Here the pairs are grouped by expert on the host (``N·k`` small numbers) and each chosen expert
runs two matmuls straight on its ``w_in[e]`` / ``w_out[e]`` views: the weights are read once, and an
idle expert is never touched.

``decode_experts`` is a ``torch.library`` custom op (forward only, no autograd) while dynamo traces: a
compiled decode step calls it as one opaque node, so the data-dependent loop neither breaks the graph
nor recompiles. Eager calls run the loop directly: the custom op's dispatch (its Python wrappers and
dynamo's disable guard) cost more host time per call than the loop's two small matmuls at the tiny
preset, and an eager decode step makes one call per MoE layer.
``by_expert`` is the loop itself, shared with the packed int8/int4 experts (``ops/quant.py``).
Tested against ``naive.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from longmoe.ops.glu import glu_act

MAX_PAIRS = 64  # (token, expert) pairs up to which a forward without autograd takes this path


def by_expert(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    expert: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``out[n] = Σ_j weights[n, j] · expert(idx[n, j], z[n])``, one ``expert`` call per distinct expert.

    z [N, ℓ]; idx, weights [N, k]; ``expert(e, x [c, ℓ]) -> [c, ℓ]`` runs expert ``e`` on the ``c``
    rows routed to it -> [N, ℓ] in z.dtype. Reads ``idx`` on the host (a sync per call); an expert no
    pair chose is never called.
    """
    N, k = idx.shape
    w = weights.reshape(-1).to(z.dtype)  # [N·k], pair p = token * k + slot
    if N == 1:  # one token: its k experts are distinct, no gather or scatter needed
        experts = idx.reshape(-1).tolist()
        out = expert(experts[0], z) * w[0]
        for j in range(1, k):
            out.add_(expert(experts[j], z) * w[j])
        return out
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, in token order within one
    counts = torch.bincount(flat).tolist()  # [max expert + 1]
    out = torch.zeros_like(z)
    start = 0
    for e, c in enumerate(counts):
        if c:
            p = order[start : start + c]
            rows = p // k  # the tokens routed to e
            out.index_add_(0, rows, expert(e, z.index_select(0, rows)) * w.index_select(0, p)[:, None])
            start += c
    return out


def decode_experts(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    glu: str,
) -> torch.Tensor:
    """``out[n] = Σ_j weights[n, j] · GLU_{idx[n, j]}(z[n])`` on the chosen experts' weight views.

    z [N, ℓ]; idx, weights [N, k]; w_in [E, ℓ, 2f] (gate|up); w_out [E, f, ℓ] -> out [N, ℓ] in z.dtype.
    Forward only; meant for ``N·k ≤ MAX_PAIRS``. The custom op under dynamo, the loop itself in eager.
    """
    if torch.compiler.is_compiling():
        return _decode_experts_op(z, idx, weights, w_in, w_out, glu)
    return _decode_experts(z, idx, weights, w_in, w_out, glu)


def _decode_experts(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    glu: str,
) -> torch.Tensor:
    return by_expert(z, idx, weights, lambda e, x: glu_act(x @ w_in[e], glu) @ w_out[e])


_decode_experts_op = torch.library.custom_op("longmoe::decode_experts", mutates_args=())(_decode_experts)


@_decode_experts_op.register_fake
def _decode_experts_shape(z, idx, weights, w_in, w_out, glu):  # noqa: ANN001, ANN202 (the op's schema)
    return torch.empty_like(z)
