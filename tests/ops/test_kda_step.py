"""KDA decode (ops/kda/step.py): one token of the recurrence, repeated, is the chunked op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longmoe.ops.gates import bounded_decay
from longmoe.ops.kda import kda_chunk, kda_step

F64 = torch.float64


def close(a, b, tol):
    err = (a - b).abs().max().item()
    assert err <= tol, f"max abs error {err:.3e} > {tol:.1e}"


def _inputs(B, T, H, K, V, seed):
    """Random float64 inputs as the layer feeds them: L2-normalised keys, bounded decay gates."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)
    q, k, v = r(B, T, H, K), F.normalize(r(B, T, H, K), dim=-1), r(B, T, H, V)
    g = bounded_decay(r(B, T, H, K), r(H, K) * 0.5)
    return q, k, v, g, torch.rand(B, T, H, generator=gen, dtype=F64)


def test_step_repeated_equals_chunk():
    """kda_step applied token by token (decode) reproduces kda_chunk's outputs and final state."""
    q, k, v, g, b = _inputs(2, 40, 3, 8, 4, seed=4)
    s = torch.randn(2, 3, 8, 4, dtype=F64)
    o_ref, s_ref = kda_chunk(q, k, v, g, b, initial_state=s, output_final_state=True)
    outs = []
    for t in range(40):
        o_t, s = kda_step(q[:, t], k[:, t], v[:, t], g[:, t], b[:, t], s)
        outs.append(o_t)
    close(torch.stack(outs, 1), o_ref, 1e-10)
    close(s, s_ref, 1e-10)


def test_step_bad_state_shape():
    """kda_step rejects a state of the wrong shape with a message naming it."""
    q = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match=r"state: expected shape \[B, H, K, V\]"):
        kda_step(q, q, torch.zeros(2, 3, 5), q, torch.zeros(2, 3), torch.zeros(2, 3, 5, 4))
