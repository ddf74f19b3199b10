"""Chunked KDA (docs/design.md §1.1): the production path, chunks of ``C`` tokens with all intra-chunk work as
batched dense matrix products over every chunk of every head at once, and only the ``[K, V]``
chunk-to-chunk state update in a Python loop. It computes what ``naive.kda_recurrent`` computes.

The factorised form ``(Q⊙e^Γ)(K⊙e^{−Γ})ᵀ`` is only finite when the cumulative in-chunk log-decay ``Γ``
stays above ≈ −88 (fp32/bf16): ``ops.gates.bounded_decay`` guarantees that for ``C = 16``. For unbounded
gates (``ops.gates.kimi_decay``) ``intra="subchunk"`` (the layers' choice) and ``intra="logspace"`` form
the same in-chunk products from decays ``e^{Σ_{j<t≤i} g_t}`` summed directly, every exponent ≤ 0
(``ops/kda/intra.py``): exact at any gate value, at the cost of elementwise work per chunk besides the
GEMM. See docs/kda.md for the derivation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longmoe.ops.kda.checks import check_inputs, check_state, compute_dtype, resolve_scale
from longmoe.ops.kda.intra import intra_logspace, intra_subchunk, suffix_after

DEFAULT_CHUNK_SIZE = 16
INTRA_MODES = ("factorised", "logspace", "subchunk")


def _chunk_layout(cu_seqlens: torch.Tensor | None, B: int, T: int, C: int, device: torch.device):
    """Where each token goes in the chunk-padded sequence and which chunks start a document.

    Returns ``(dest, Tp, first, last, n_docs)``: ``dest`` (``[T]`` LongTensor or None when no gather
    is needed) maps packed token ``t`` to its padded position; ``Tp`` is the padded length (a multiple
    of ``C``); ``first[n]`` is the document whose first chunk is ``n`` (else -1), ``last[d]`` the last
    chunk of document ``d`` (-1 for an empty document).
    """
    if cu_seqlens is None:
        n_chunks = -(-T // C)
        first = [0] + [-1] * (n_chunks - 1) if n_chunks else []
        return None, n_chunks * C, first, [n_chunks - 1], 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    n_docs = len(lengths)
    doc_chunks = [-(-n // C) for n in lengths]
    first: list[int] = [-1] * sum(doc_chunks)
    last: list[int] = []
    start = 0
    for d, nc in enumerate(doc_chunks):
        if nc:
            first[start] = d
        start += nc
        last.append(start - 1 if nc else -1)
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    lengths_t = cu[1:] - cu[:-1]  # [N]
    padded_starts = torch.tensor([0] + doc_chunks[:-1], device=device, dtype=torch.long).cumsum(0) * C
    doc_of_token = torch.repeat_interleave(torch.arange(n_docs, device=device), lengths_t)  # [T]
    offset = torch.arange(T, device=device) - cu[doc_of_token]
    dest = padded_starts[doc_of_token] + offset  # [T]
    return dest, sum(doc_chunks) * C, first, last, n_docs


def _to_chunks(
    x: torch.Tensor, dest: torch.Tensor | None, Tp: int, C: int, out: torch.Tensor
) -> torch.Tensor:
    """Write [Bt, T, H, D] packed tokens into ``out`` [N, Bt*H, C, D] (chunk-major), zero-padded.

    One strided copy that also casts to the compute dtype; with ``cu_seqlens`` (``dest``) documents are
    first scattered to chunk-aligned positions so that no chunk straddles a document boundary.
    """
    Bt, T, H, D = x.shape
    N = Tp // C
    if dest is not None:
        x = x.new_zeros(Bt, Tp, H, D).index_copy(1, dest, x)
    elif Tp != T:
        x = F.pad(x, (0, 0, 0, 0, 0, Tp - T))
    out.view(N, Bt, H, C, D).copy_(x.view(Bt, N, C, H, D).permute(1, 0, 3, 2, 4))
    return out


def _from_chunks(o: torch.Tensor, dest: torch.Tensor | None, Bt: int, T: int, H: int) -> torch.Tensor:
    """Inverse of ``_to_chunks``: [N, Bt*H, C, D] -> [Bt, T, H, D]."""
    N, _, C, D = o.shape
    o = o.reshape(N, Bt, H, C, D).permute(1, 0, 3, 2, 4).reshape(Bt, N * C, H, D)
    return o[:, :T] if dest is None else o.index_select(1, dest)


def kda_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    intra: str = "factorised",
    return_chunk_states: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None] | tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Chunked KDA: the same result as ``kda_recurrent`` with all intra-chunk work as batched GEMMs.

    ``intra``: ``"factorised"`` (GEMMs; needs the in-chunk log-decay sum above ≈ −88, which the bounded
    gate guarantees), or, exact for any gate, ``"subchunk"`` (the chunk halved down to single tokens, GEMMs
    between the halves, no log space) or ``"logspace"`` (every pair in log space); see ``ops/kda/intra.py``.

    ``q, k, g``: ``[B, T, H, K]``; ``v``: ``[B, T, H, V]``; ``beta``: ``[B, T, H]``. With ``cu_seqlens``
    (``[N+1]`` LongTensor of document offsets, ``B == 1``) the state resets at every document boundary
    and ``initial_state`` / ``final_state`` are ``[N, H, K, V]``; otherwise ``[B, H, K, V]``.
    Returns ``(o [B, T, H, V] in v.dtype, final_state in fp32 (float64 for float64 inputs) or None)``.
    ``return_chunk_states`` (no ``cu_seqlens``) adds a third output, the state after every full chunk
    ``[n, B, H, K, V]`` (``[j]``: after the first ``(j+1)·C`` tokens, ``n = T // C``): what the scan
    computes anyway, for prefix reuse to keep states at chunk boundaries without a second pass.

    Per chunk ``n`` (all chunks of all heads batched), with ``Γ`` the in-chunk cumulative log-decay::

        A   = tril(diag(β) (K⊙e^Γ)(K⊙e^{−Γ})ᵀ, −1),   (I + A)[W | U] = diag(β)[K⊙e^Γ | V]
        V'_n = U − W S_n,   S_{n+1} = Diag(e^{Γ_C}) S_n + (K⊙e^{Γ_C−Γ})ᵀ V'_n
        O_n = (Q⊙e^Γ) S_n + P V'_n,   P = tril((Q⊙e^Γ)(K⊙e^{−Γ})ᵀ)

    so the sequential part is two small GEMMs per chunk (``baddbmm``) and the outputs are batched again
    after the scan. (Fusing the scan into one ``S_{n+1} = M_n S_n + B_n`` GEMM with a precomputed ``[K, K]``
    transition was measured slower on CPU: ``M`` is ``K/C`` times larger than the chunk inputs.)
    """
    B, T, H, K, V = check_inputs(q, k, v, g, beta)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    if intra not in INTRA_MODES:
        raise ValueError(f"intra: expected one of {INTRA_MODES}, got {intra!r}")
    if cu_seqlens is not None:
        if return_chunk_states:
            raise ValueError("return_chunk_states: not supported with cu_seqlens")
        _check_cu_seqlens(cu_seqlens, B, T, q.device)
        n_docs = cu_seqlens.numel() - 1
        state_shape, state_expect = (n_docs, H, K, V), "[N, H, K, V] (N = len(cu_seqlens) - 1)"
    else:
        state_shape, state_expect = (B, H, K, V), "[B, H, K, V]"
    if initial_state is not None:
        check_state("initial_state", initial_state, state_shape, state_expect, q)
    scale = resolve_scale(scale, K)
    C = chunk_size
    cdt = compute_dtype(v.dtype)

    dest, Tp, first, last, n_docs = _chunk_layout(cu_seqlens, B, T, C, q.device)
    Bt, G = B, B * H  # Bt: batch of the chunk sequence (1 with cu_seqlens); G: independent state slots
    N = Tp // C
    if N == 0:
        final = None
        if output_final_state:
            final = q.new_zeros(state_shape, dtype=cdt) if initial_state is None else initial_state.to(cdt)
        if return_chunk_states:
            return v.new_zeros(B, T, H, V), final, q.new_zeros(0, B, H, K, V, dtype=cdt)
        return v.new_zeros(B, T, H, V), final
    new = {"device": q.device, "dtype": cdt}
    kq = torch.empty(N, G, 2, C, K, **new)  # K rows then Q rows of each chunk: one GEMM for both products
    _to_chunks(k, dest, Tp, C, kq[:, :, 0])
    _to_chunks(q, dest, Tp, C, kq[:, :, 1])
    vc = _to_chunks(v, dest, Tp, C, torch.empty(N, G, C, V, **new))  # [N, G, C, V]
    gc = _to_chunks(g, dest, Tp, C, torch.empty(N, G, C, K, **new))  # [N, G, C, K]
    bc = _to_chunks(beta.unsqueeze(-1), dest, Tp, C, torch.empty(N, G, C, 1, **new))  # [N, G, C, 1]

    # ---- chunk-local work, batched over all N*G chunks at once -----------------------------------------
    gam = gc.cumsum(dim=-2)  # [N, G, C, K]  Γ in [C·g_min, 0]: e^{±Γ} finite iff |Γ| < ~88
    e_pos = gam.exp()  # e^Γ
    kq_pos = kq * e_pos.unsqueeze(2)  # [N, G, 2, C, K]  K⊙e^Γ | Q⊙e^Γ
    d_last = e_pos[..., -1, :].unsqueeze(-1).contiguous()  # [N, G, K, 1]  e^{Γ_C}
    if intra == "factorised":
        # K⊙e^{−Γ} as a product with its own exp, not K / e^Γ: the backward of a division forms K·e^{−2Γ},
        # which overflows fp32 once Γ < −44 (a channel near g_min for 9+ steps of a chunk): inf in dg
        k_neg = kq[:, :, 0] * (-gam).exp()  # [N, G, C, K]
        inter = kq_pos.view(N, G, 2 * C, K) @ k_neg.transpose(-1, -2)  # [N, G, 2C, C]
        k_dec = k_neg * d_last.transpose(-1, -2)  # [N, G, C, K]  K⊙e^{Γ_C−Γ}
    else:
        inter = (intra_logspace if intra == "logspace" else intra_subchunk)(kq, gc)  # [N, G, 2C, C]
        # Γ_C − Γ_j = Σ_{t>j} g_t as a suffix sum (no difference of large prefix sums), exponents ≤ 0
        after = suffix_after(gc)  # [N, G, C, K]
        k_dec = kq[:, :, 0] * after.exp()  # [N, G, C, K]  K⊙e^{Γ_C−Γ}
    a_kk = torch.tril(bc * inter[..., :C, :], diagonal=-1)  # [N, G, C, C]  strictly lower: A
    a_qk = torch.tril(inter[..., C:, :])  # [N, G, C, C]  causal incl. diagonal: P
    # WY/UT transform: (I + A)^{-1} by one unit-triangular solve against the C×C identity (cheaper than
    # solving for all K+V right-hand sides), then [W | U] = (I + A)^{-1} diag(β) [K⊙e^Γ | V] as a GEMM
    eye = torch.eye(C, **new).expand(N, G, C, C)
    a_inv = torch.linalg.solve_triangular(a_kk, eye, upper=False, unitriangular=True)  # [N, G, C, C]
    wu = (a_inv * bc.transpose(-1, -2)) @ torch.cat([kq_pos[:, :, 0], vc], dim=-1)  # [N, G, C, K+V]
    w, u = wu[..., :K].contiguous(), wu[..., K:].contiguous()  # [N, G, C, K], [N, G, C, V]
    k_dec_t = k_dec.transpose(-1, -2).contiguous()  # [N, G, K, C]

    # ---- the only sequential part: V'_n = U − W S_n,  S_{n+1} = Diag(e^{Γ_C}) S_n + (K⊙e^{Γ_C−Γ})ᵀ V'_n ----
    init = None if initial_state is None else initial_state.to(cdt).reshape(-1, G, K, V)  # [docs, G, K, V]
    resets = {n: d for n, d in enumerate(first) if d >= 0}
    ends = {n for n in last if n >= 0}
    track = torch.is_grad_enabled() and any(
        x.requires_grad for x in (q, k, v, g, beta, initial_state) if x is not None
    )
    scan = _scan_autograd if track else _scan_inplace
    s_in, deltas, s_out = scan(w, u, d_last, k_dec_t, init, resets, ends)  # [N, G, K, V], [N, G, C, V], {}

    # ---- outputs, batched again: O = (Q⊙e^Γ) S_n + P V'_n -------------------------------------------------
    o = torch.baddbmm(
        (a_qk @ deltas).flatten(0, 1), kq_pos[:, :, 1].flatten(0, 1), s_in.flatten(0, 1)
    )  # [N*G, C, V]
    out = _from_chunks(scale * o.view(N, G, C, V), dest, Bt, T, H).to(v.dtype)

    final = None
    if output_final_state:
        rows = []
        for d in range(n_docs):
            if last[d] >= 0:
                rows.append(s_out[last[d]])
            else:  # empty document: the state passes through unchanged
                rows.append(q.new_zeros(G, K, V, dtype=cdt) if init is None else init[d])
        final = torch.stack(rows).reshape(state_shape)
    if return_chunk_states:
        n_full = T // C  # states[j] enters chunk j: after chunk j-1; the last full chunk's is its output
        after = [s_in[j] for j in range(1, min(n_full, N - 1) + 1)]
        if n_full == N:
            after.append(s_out[N - 1])  # no cu_seqlens: the one document ends at the last chunk
        empty = s_in.new_zeros(0, B, H, K, V)
        chunk_states = torch.stack(after).reshape(n_full, B, H, K, V) if after else empty
        return out, final, chunk_states
    return out, final


def _scan_autograd(w, u, d_last, k_dec_t, init, resets, ends):
    """Chunk-to-chunk state scan with autograd: one node per step, states stacked afterwards.

    ``resets``: ``{chunk: doc}`` where a document starts (state := its initial state); ``ends``: chunks
    whose outgoing state is a document's final state. Returns ``(S_in [N, G, K, V], V' [N, G, C, V],
    {chunk: S_out [G, K, V]})``.
    """
    N, G, C, K = w.shape
    zero = w.new_zeros(G, K, u.shape[-1])
    S = zero
    s_in, deltas, out = [], [], {}
    # unbind, not x[n]: one backward node per tensor instead of a full-size zero-filled gradient per step
    u_, w_, dl_, kd_ = (x.unbind(0) for x in (u, w, d_last, k_dec_t))
    init_ = None if init is None else init.unbind(0)
    for n in range(N):
        if n in resets:
            S = zero if init_ is None else init_[resets[n]]
        delta = torch.baddbmm(u_[n], w_[n], S, alpha=-1.0)  # [G, C, V]  V' = U − W S
        s_in.append(S)
        deltas.append(delta)
        S = torch.baddbmm(dl_[n] * S, kd_[n], delta)  # [G, K, V]
        if n in ends:
            out[n] = S
    return torch.stack(s_in), torch.stack(deltas), out


def _scan_inplace(w, u, d_last, k_dec_t, init, resets, ends):
    """The same scan without autograd, writing into preallocated buffers (no per-step allocation)."""
    N, G, C, K = w.shape
    V = u.shape[-1]
    states = w.new_empty(N + 1, G, K, V)  # states[n] enters chunk n; states[n+1] leaves it
    deltas = u.clone()  # [N, G, C, V]  becomes V' = U − W S in place
    out = {}
    s_, d_, w_, dl_, kd_ = (x.unbind(0) for x in (states, deltas, w, d_last, k_dec_t))  # views, made once
    for n in range(N):
        if n in resets:
            s_[n].copy_(0 if init is None else init[resets[n]])
        d_[n].baddbmm_(w_[n], s_[n], alpha=-1.0)  # V' = U − W S
        torch.mul(s_[n], dl_[n], out=s_[n + 1])
        s_[n + 1].baddbmm_(kd_[n], d_[n])
        if n in ends:  # copied: a reset at chunk n+1 overwrites states[n+1]
            out[n] = s_[n + 1].clone()
    return states[:N], deltas, out


def _check_cu_seqlens(cu: object, B: int, T: int, device: torch.device) -> None:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(
            f"cu_seqlens: expected a 1-D LongTensor [N+1] of document offsets, got "
            f"{getattr(cu, 'shape', type(cu))}"
        )
    if cu.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"cu_seqlens: expected an int64 (or int32) tensor, got {cu.dtype}")
    if cu.device != device:
        raise ValueError(f"cu_seqlens: expected device {device} (same as q), got {cu.device}")
    if B != 1:
        raise ValueError(f"q: with cu_seqlens the batch must be packed into B = 1, got B = {B}")
    vals = cu.tolist()
    if vals[0] != 0 or vals[-1] != T or any(b < a for a, b in zip(vals, vals[1:])):
        raise ValueError(
            f"cu_seqlens: expected non-decreasing offsets from 0 to T = {T}, got {vals[:8]}"
            f"{'...' if len(vals) > 8 else ''}"
        )
