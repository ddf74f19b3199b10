"""Routed GLU experts of one token as gathered reductions: the form a compiled CPU decode step traces.

At batch-1 decode a MoE layer reads its ``k`` chosen experts' weights once; the speed is memory
bandwidth. The custom op (``decode.py``) runs two BLAS matmuls per expert, and BLAS's one-row fp32
kernel uses one thread (8-9 GB/s here at 1 and 2 threads alike on the 0.3B model's experts). Written
as ``(z[None, :, None] * w_in[idx]).sum(1)`` the same product becomes, under inductor, one C++
reduction whose loads index ``w_in`` by ``idx`` directly: the gather is never materialized, the loop
is vectorized along the weight's contiguous axis and split across threads (12 GB/s at 1 thread, 19 at
2, same weights; docs/benchmarks.md). Eagerly the same code would copy the ``k`` experts' weights first,
so ``MoELayer`` takes this path only while compiling a step of one token on CPU (``one_token_compiled``).

``gathered_reduction`` is the fp32 (float stack) form; ``ops/quant.py`` has the int8 one. Tested
against ``naive.py``.
"""

from __future__ import annotations

import torch

from longmoe.ops.glu import glu_act


def one_token_compiled(z: torch.Tensor) -> bool:
    """True while dynamo traces a step whose expert input is one fp32 token (a static first dim of 1)
    on CPU: the case the reductions below are measured for (a symbolic batch, other dtypes and other
    devices keep the custom op). ``is_dynamo_compiling``, not the process-wide ``is_compiling`` flag: an
    eager step in another thread while the warm-up thread compiles keeps the custom op."""
    n = z.shape[0]
    one = isinstance(n, int) and n == 1
    cpu_fp32 = z.device.type == "cpu" and z.dtype == torch.float32
    return torch.compiler.is_dynamo_compiling() and one and cpu_fp32


def gathered_reduction(
    z: torch.Tensor,
    idx: torch.Tensor,
    weights: torch.Tensor,
    w_in: torch.Tensor,
    w_out: torch.Tensor,
    glu: str,
) -> torch.Tensor:
    """``out = Σ_j weights[0, j] · GLU_{idx[0, j]}(z[0])`` for one token, as broadcast products and sums.

    z [1, ℓ]; idx, weights [1, k]; w_in [E, ℓ, 2f] (in × out, gate|up); w_out [E, f, ℓ] -> [1, ℓ].
    """
    e = idx[0]  # [k]
    h = (z[0][None, :, None] * w_in[e]).sum(1)  # [k, 2f]
    a = glu_act(h, glu)  # [k, f]
    y = (a[:, :, None] * w_out[e]).sum(1)  # [k, ℓ]
    return (y * weights[0][:, None].to(y.dtype)).sum(0, keepdim=True)  # [1, ℓ]
