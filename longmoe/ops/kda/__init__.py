"""KDA: the channel-wise gated delta rule (docs/design.md §1.1) as CPU operators.

Per head, state ``S ∈ R^{K×V}``; for each token ``t``::

    S'_t = Diag(exp(g_t)) S_{t-1}
    S_t  = S'_t + β_t k_t (v_t − S'_tᵀ k_t)ᵀ
    o_t  = scale · S_tᵀ q_t                     (scale defaults to K^{-1/2})

- ``chunk.kda_chunk``: the production path (training and prefill), chunks of ``C`` tokens as batched GEMMs;
- ``step.kda_step``: one token of the recurrence (decode);
- ``naive.kda_recurrent``: that loop verbatim, token by token (slow; float64-able; the oracle).

The ops do not L2-normalise q/k (the layer does). States are fp32 (float64 for float64 inputs);
outputs have ``v.dtype``; bf16 inputs are computed in fp32. See docs/kda.md for the derivation.
"""

from longmoe.ops.kda.chunk import DEFAULT_CHUNK_SIZE, kda_chunk
from longmoe.ops.kda.naive import kda_recurrent
from longmoe.ops.kda.step import kda_step

__all__ = ["DEFAULT_CHUNK_SIZE", "kda_chunk", "kda_recurrent", "kda_step"]
