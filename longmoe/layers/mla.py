"""Gated Multi-head Latent Attention, NoPE: softmax attention whose only cache is a latent ``c``.

``c_t = RMSNorm(W_dkv x_t) ∈ R^{d_c}`` is cached; per head ``k = W_uk c``, ``v = W_uv c``; queries go
through a low rank ``q = W_uq RMSNorm(W_dq x)`` (or one full-rank ``W_q x`` with ``mla_q_lora_rank = 0``).
No positional encoding at all. The head outputs are gated element-wise by ``sigmoid(W_gate x)`` before
``o_proj`` (no attention sinks); ``mla_gate = False`` drops the gate (Kimi-Linear's MLA).

Shared key part (``mla_shared_key_dim = d_r > 0``, Kimi-Linear's ``k_pe`` with NoPE): the kv down
projection also gives ``k_r = W_kr x ∈ R^{d_r}`` (not normalised, not rotated), one key part for all
heads (MQA-style). Query heads are ``[q_h | q_r,h]`` (``Dq + d_r``), keys ``[W_uk,h c | k_r]``, so the
score is ``q_h·W_uk,h c + q_r,h·k_r`` scaled by ``(Dq + d_r)^-1/2``. The cache row of a token is
``[c | k_r]`` (``d_c + d_r`` numbers); with ``d_r = 0`` everything is the plain latent.

Log-length scaling (``mla_logn_scale = s > 0``; scalable softmax, Nakanishi 2025, the attention-temperature
tuning Llama 4 applies to its NoPE layers): the query of a token that sees ``n`` keys (its position in its
sequence + 1) is multiplied by ``s · ln n`` before attending, so its logits are; the softmax then stays
as peaked over 64K keys as over 64. Every path scales the query by the same factor of the same position
(``length_scaled``): training, packed documents, cached prefill and decode (naive and absorbed, the split
long-prefix path included: it takes the scaled query) and ``attend_at``.

Two ways to attend against the cache, which must agree:
- naive: expand ``k, v`` for every cached token, then attend;
- absorbed: fold ``W_uk`` into the query (``q̃_h = [W_ukᵀ q_h | q_r,h] ∈ R^{d_c + d_r}``) and ``W_uv``
  into the output, attending directly against the cache rows ``[c | k_r]`` (values: ``c`` alone) — per
  step it reads ``d_c + d_r`` numbers per cached token, not ``H·(K+V)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longmoe.cache import MLAState, Packing
from longmoe.config import ModelConfig
from longmoe.layers.norm import RMSNorm
from longmoe.layers.shapes import shape_static
from longmoe.ops.attention import causal_after_prefix, latent_attention, packed_causal_attention

DECODE_PATHS = ("auto", "absorbed", "naive")
FOLD_MAX_QUERIES = 256  # absorbed attention: heads·tokens up to which heads fold into one query axis
# rows of differing lengths, decode-sized call: one masked call over at most this many cached rows (the
# unfused kernel's [B, H·T, S] scores stay small) instead of one fused call per row (host work per row)
MASKED_MAX_ROWS = 16384


class MLALayer(nn.Module):
    """Gated NoPE MLA token mixer: ``x [B, T, d] -> [B, T, d]``, optionally continuing an ``MLAState``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d, H = cfg.d_model, cfg.mla_heads
        self.H, self.Dq, self.Dv = H, cfg.mla_head_dim, cfg.mla_v_head_dim
        self.q_rank, self.d_c, self.d_r = cfg.mla_q_lora_rank, cfg.mla_kv_lora_rank, cfg.mla_shared_key_dim
        self.Dk = self.Dq + self.d_r  # query / key head dim: the latent-keyed part, then the shared part
        eps = cfg.norm_eps if cfg.mla_norm_eps is None else cfg.mla_norm_eps
        # q down (or the full-rank q) | kv down (latent, then the shared key part) | output gate
        self.splits = (self.q_rank or H * self.Dk, self.d_c + self.d_r, H * self.Dv if cfg.mla_gate else 0)
        self.in_proj = nn.Linear(d, sum(self.splits), bias=False)
        self.q_norm = RMSNorm(self.q_rank, eps) if self.q_rank else None
        self.q_up = nn.Linear(self.q_rank, H * self.Dk, bias=False) if self.q_rank else None
        self.kv_norm = RMSNorm(self.d_c, eps)
        self.kv_up = nn.Linear(self.d_c, H * (self.Dq + self.Dv), bias=False)  # W_uk (all heads) | W_uv
        self.o_proj = nn.Linear(H * self.Dv, d, bias=False)
        self.scale = self.Dk**-0.5
        self.logn_scale = float(cfg.mla_logn_scale)  # 0.0: plain softmax (see the module docstring)
        self.decode_path = "auto"  # how a call with a cache attends: "auto" (by cost), "absorbed" or "naive"
        # static shapes (torch.compile'd steps): attend over the whole latent buffer with a per-row mask
        # instead of slicing it to the longest row; the caller reserves the capacity (Cache.reserve)
        self.static_shapes = False

    @staticmethod
    def param_count(cfg: ModelConfig) -> int:
        d, H, Dq, Dv = cfg.d_model, cfg.mla_heads, cfg.mla_head_dim, cfg.mla_v_head_dim
        rq, dc, dr = cfg.mla_q_lora_rank, cfg.mla_kv_lora_rank, cfg.mla_shared_key_dim
        Dk = Dq + dr
        q = d * rq + rq + rq * H * Dk if rq else d * H * Dk
        gate = d * H * Dv if cfg.mla_gate else 0
        return q + d * (dc + dr) + gate + dc + dc * H * (Dq + Dv) + H * Dv * d

    @torch.no_grad()
    def init_weights(self, std: float, out_std: float) -> None:
        for lin in (self.in_proj, self.q_up, self.kv_up):
            if lin is not None:
                nn.init.normal_(lin.weight, std=std)
        nn.init.normal_(self.o_proj.weight, std=out_std)
        if self.q_norm is not None:
            self.q_norm.weight.fill_(1.0)
        self.kv_norm.weight.fill_(1.0)

    def _w_uk_uv(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.kv_up.weight  # [H*(Dq+Dv), d_c]
        H = self.H
        return w[: H * self.Dq].view(H, self.Dq, self.d_c), w[H * self.Dq :].view(H, self.Dv, self.d_c)

    def forward(
        self,
        x: torch.Tensor,
        state: MLAState | None = None,
        seq_lens: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> torch.Tensor:
        """``x [B, T, d]``. With ``state`` the new cache rows are appended after ``seq_lens [B]`` per row."""
        B, T, _ = x.shape
        q, c, gate = self.project(x)  # [B, H, T, Dk], [B, T, d_c + d_r], [B, T, H*Dv]
        if self.logn_scale:
            q = self.length_scaled(q, self._positions(T, state, seq_lens, packing, x.device))
        mask, causal, starts = None, False, None
        static = shape_static(self)  # read once: the layout and the attention below must agree
        if state is None:
            ctx = c  # [B, S=T, d_c + d_r]
            causal = packing is None  # packed documents: block-diagonal causal, see below
            path = "naive"
        elif static:
            ctx, mask = self._append_static(state, c, seq_lens)  # [B, cap, d_c + d_r], [B, 1, T, cap]
            path = self.cached_path(T)
        else:
            ctx, starts = self._append(state, c, seq_lens)  # [B, S, d_c + d_r], cached rows per row
            path = self.cached_path(T)
        if path == "naive":
            k, v = self.expand_kv(ctx)  # [B, H, S, Dk], [B, H, S, Dv]
            if state is None and packing is not None:  # per document, no [T, T] mask (ops/)
                o = packed_causal_attention(q, k, v, packing.cu_seqlens, scale=self.scale)
            elif starts is not None:  # per row: its cached prefix, then causal (no [T, S] mask, ops/)
                o = self._per_row(starts, T, q, lambda b, p: causal_after_prefix(
                    q[b], k[b, :, : p + T], v[b, :, : p + T], p, scale=self.scale))  # fmt: skip
            else:
                o = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale
                )
        elif path == "absorbed":
            o = self._attend_absorbed(q, ctx, mask, starts)  # [B, H, T, Dv]
        else:
            raise ValueError(f"decode_path: expected one of {DECODE_PATHS}, got {path!r}")
        return self.output(o, gate)

    def length_scaled(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``q [B, H, T, Dk]`` of queries at ``positions`` (0-based in their sequence, ``[T]`` or ``[B, T]``)
        times ``logn_scale · ln(position + 1)`` (the keys each sees); ``q`` itself when the scaling is off."""
        if not self.logn_scale:
            return q
        f = self.logn_scale * torch.log1p(positions.to(device=q.device, dtype=torch.float32))  # [T] | [B, T]
        f = f.view(-1, 1, q.shape[2], 1) if f.dim() == 2 else f.view(1, 1, -1, 1)  # [B | 1, 1, T, 1]
        return q * f.to(q.dtype)

    @staticmethod
    def _positions(
        T: int,
        state: MLAState | None,
        seq_lens: torch.Tensor | None,
        packing: Packing | None,
        device: torch.device,
    ) -> torch.Tensor:
        """Each new token's position in its sequence: ``[T]`` (from 0; inside its document when packed) or,
        continuing a cache, ``[B, T]`` after each row's ``seq_lens`` (tensor arithmetic: no host sync)."""
        t = torch.arange(T, device=device)
        if state is None:
            return t if packing is None else packing.doc_pos.to(device)
        if seq_lens is None:
            raise ValueError("seq_lens: a call continuing a cache needs each row's cached length")
        return seq_lens.to(device)[:, None] + t[None, :]

    @staticmethod
    def _per_row(starts: list[int], T: int, q: torch.Tensor, attend) -> torch.Tensor:  # noqa: ANN001
        """``attend(rows, prefix)`` once for all rows when they share one cached length (``starts`` has one
        entry), else per row ``b`` (``attend(slice(b, b + 1), starts[b])``): ``[B, H, T, D]``."""
        if len(starts) == 1:
            return attend(slice(None), starts[0])
        return torch.cat([attend(slice(b, b + 1), p) for b, p in enumerate(starts)])

    def cached_path(self, T: int) -> str:
        """How a call of ``T`` new tokens attends against a cache. Per cache row, the absorbed path
        attends at ``2(d_c + d_r)`` multiply-adds per query and head; the naive path first expands the
        row to per-head keys and values (``d_c(Dq + Dv)`` per head, once per call) and then attends at
        ``Dk + Dv``. So decode-sized calls absorb and long prefill chunks expand (at the 0.3B benchmark
        model's shapes from ``T`` ≈ 205 on; a 2,048-token chunk does half the absorbed work)."""
        if self.decode_path != "auto":
            return self.decode_path
        naive = self.d_c * (self.Dq + self.Dv) + T * (self.Dk + self.Dv)
        return "naive" if naive < 2 * T * (self.d_c + self.d_r) else "absorbed"

    def _attend_absorbed(
        self, q: torch.Tensor, ctx: torch.Tensor, mask: torch.Tensor | None, starts: list[int] | None
    ) -> torch.Tensor:
        """Attend ``q [B, H, T, Dk]`` directly against the cache rows ``ctx [B, S, d_c + d_r]`` ->
        ``[B, H, T, Dv]``: after ``starts`` cached rows per row (one entry: every row), or under ``mask
        [B, 1, T, S]`` (static shapes).

        Every head attends over the *same* rows, so the heads fold into the query axis and the cache is
        read once, not once per head (through a stride-0 per-head view the CPU kernel copies it ``H``
        times: 4x the whole decode step at 16K context). Eager calls go through ``latent_attention``
        (``ops/attention/latent.py``: fused, no ``[T, S]`` mask, the cached length split over threads);
        the static-shape (compiled) call keeps one masked attention over the whole buffer, folded for
        decode-sized calls (``H·T ≤ FOLD_MAX_QUERIES``). Values are the whole rows and the output keeps
        the first ``d_c`` columns (the latent ``c``): ``d_r`` extra columns of work instead of a strided
        copy of the cache.
        """
        B, H, T, _ = q.shape
        w_uk, w_uv = self._w_uk_uv()
        q_abs = q[..., : self.Dq] @ w_uk  # [B, H, T, d_c] (per head: [T, Dq] @ [Dq, d_c])
        if self.d_r:  # keys [c | k_r] against [W_ukᵀ q | q_r]
            q_abs = torch.cat([q_abs, q[..., self.Dq :]], dim=-1)  # [B, H, T, d_c + d_r]
        C, S = ctx.shape[-1], ctx.shape[1]
        if starts is not None and len(starts) > 1 and H * T <= FOLD_MAX_QUERIES and S <= MASKED_MAX_ROWS:
            mask = self._row_mask(starts, T, S, ctx.device)  # a short batched decode: one masked call
            starts = None
        if starts is not None:
            o_lat = self._per_row(starts, T, q_abs, lambda b, p: latent_attention(
                q_abs[b], ctx[b, : p + T], p, scale=self.scale))  # fmt: skip
        elif H * T <= FOLD_MAX_QUERIES:
            kv = ctx.unsqueeze(1)  # [B, 1, S, C]
            if mask is not None:  # query (h, t) has query t's mask
                mask = mask.expand(mask.shape[0], H, T, S).reshape(mask.shape[0], 1, H * T, S)
            o_lat = F.scaled_dot_product_attention(
                q_abs.reshape(B, 1, H * T, C), kv, kv, attn_mask=mask, scale=self.scale
            ).view(B, H, T, C)
        else:
            kv = ctx.unsqueeze(1).expand(B, H, S, C)  # [B, H, S, C] (a view)
            o_lat = F.scaled_dot_product_attention(q_abs, kv, kv, attn_mask=mask, scale=self.scale)
        o_lat = o_lat[..., : self.d_c]  # [B, H, T, d_c]
        return o_lat @ w_uv.transpose(1, 2)  # [B, H, T, Dv] (per head: [T, d_c] @ [d_c, Dv])

    def attend_at(
        self, x: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's output for ``n`` tokens only: ``x [B, n, d]`` (this layer's input at them) at
        ``positions [B, n]`` of rows whose cache rows are ``rows [B, S, d_c + d_r]`` (``project`` of every
        token, the tokens' own included); each attends to the rows ``j ≤ its position``, as in
        ``forward``. Returns ``(out [B, n, d], weights [B, H, n, S])``, the attention weights (0 past a
        query's position). Reading a few positions of a long sequence costs ``O(n · S)``, not ``O(S²)``."""
        B, n, _ = x.shape
        S = rows.shape[1]
        if positions.shape != (B, n) or rows.shape[0] != B or (n and int(positions.max()) >= S):
            raise ValueError(
                f"positions: expected [{B}, {n}] below the {S} rows given, got {list(positions.shape)}"
            )
        q, _, gate = self.project(x)  # [B, H, n, Dk], -, [B, n, H*Dv]
        q = self.length_scaled(q, positions)
        k, v = self.expand_kv(rows)  # [B, H, S, Dk], [B, H, S, Dv]
        scores = torch.einsum("bhnk,bhsk->bhns", q, k.to(q.dtype)).float() * self.scale  # [B, H, n, S]
        seen = torch.arange(S, device=x.device)[None, None, :] <= positions[:, :, None]  # [B, n, S]
        w = torch.softmax(scores.masked_fill(~seen[:, None], float("-inf")), dim=-1)  # [B, H, n, S]
        o = torch.einsum("bhns,bhsv->bhnv", w.to(v.dtype), v)  # [B, H, n, Dv]
        return self.output(o.to(x.dtype), gate), w

    # the three pieces around the attention (also the seam context parallelism builds on)
    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, d]`` -> ``(q [B, H, T, Dk], cache rows [B, T, d_c + d_r], output gate [B, T, H·Dv])``:
        a cache row is the normalised latent ``c``, then the shared key part ``k_r`` (neither normalised
        nor rotated); the gate is ``[B, T, 0]`` without ``mla_gate``."""
        B, T, _ = x.shape
        q_lat, c, gate = self.in_proj(x).split(self.splits, dim=-1)
        if self.q_up is not None:  # low-rank q; with mla_q_lora_rank = 0, q_lat is already q
            q_lat = self.q_up(self.q_norm(q_lat))
        q = q_lat.view(B, T, self.H, self.Dk).transpose(1, 2)  # [B, H, T, Dk]: [q_h | q_r,h] per head
        if self.d_r:
            c, k_r = c.split((self.d_c, self.d_r), dim=-1)
            return q, torch.cat([self.kv_norm(c), k_r], dim=-1), gate
        return q, self.kv_norm(c), gate

    def expand_kv(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys and values of cache rows ``ctx [B, S, d_c + d_r]``: ``k [B, H, S, Dk]``, rows
        ``[W_uk,h c | k_r]`` (the shared part is the same for every head), and ``v [B, H, S, Dv]``."""
        B, S, H, Dq, Dv = ctx.shape[0], ctx.shape[1], self.H, self.Dq, self.Dv
        k, v = self.kv_up(ctx[..., : self.d_c]).split((H * Dq, H * Dv), dim=-1)  # [B, S, H*Dq], [B, S, H*Dv]
        k = k.view(B, S, H, Dq).transpose(1, 2)  # [B, H, S, Dq]
        if self.d_r:
            k_r = ctx[..., self.d_c :].unsqueeze(1).expand(B, H, S, self.d_r)  # [B, H, S, d_r]
            k = torch.cat([k, k_r.to(k.dtype)], dim=-1)  # [B, H, S, Dk]
        return k, v.view(B, S, H, Dv).transpose(1, 2)

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """Gate the head outputs ``o [B, H, T, Dv]`` by ``sigmoid(gate)`` (unless ``mla_gate`` is off) and
        project: ``[B, T, d]``."""
        B, H, T, Dv = o.shape
        o = o.transpose(1, 2)  # [B, T, H, Dv]
        if self.splits[2]:  # no gate without mla_gate (gate is then [B, T, 0])
            o = o * torch.sigmoid(gate).view(B, T, H, Dv)
        return self.o_proj(o.reshape(B, T, H * Dv))

    @staticmethod
    def _row_mask(starts: list[int], T: int, S: int, device: torch.device) -> torch.Tensor:
        """``[B, 1, T, S]``: query ``t`` of row ``b`` sees rows ``j ≤ starts[b] + t``."""
        pos = torch.tensor(starts, device=device)[:, None] + torch.arange(T, device=device)[None, :]  # [B, T]
        return (torch.arange(S, device=device)[None, None, :] <= pos[:, :, None])[:, None]

    @staticmethod
    def _append(state: MLAState, c: torch.Tensor, seq_lens: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """Write the cache rows ``c [B, T, d_c + d_r]`` after each row's ``seq_lens`` and return
        ``(context [B, max(seq_lens) + T, d_c + d_r], starts)``: ``starts`` the cached length of every
        row, one entry when all rows are aligned (then the attention needs no per-row work)."""
        B, T, _ = c.shape
        lens = seq_lens.to(c.device)
        starts = [int(n) for n in lens.tolist()]
        lo, hi = min(starts), max(starts)
        S = hi + T
        state.ensure_capacity(S)
        c = c.to(state.buf.dtype)
        if lo == hi:  # all rows aligned: a slice write
            state.buf[:, hi:S] = c
            return state.buf[:, :S], [hi]
        pos = lens[:, None] + torch.arange(T, device=c.device)[None, :]  # [B, T]
        rows = torch.arange(B, device=c.device)[:, None].expand(B, T)
        state.buf[rows, pos] = c
        return state.buf[:, :S], starts

    @staticmethod
    def _append_static(
        state: MLAState, c: torch.Tensor, seq_lens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``_append`` without reading lengths on the host: every row writes at its own positions and
        the context is the whole buffer ``[B, capacity, d_c + d_r]`` (capacity >= seq_lens + T, reserved by
        the caller) with mask ``[B, 1, T, capacity]``; shapes depend on ``B, T`` and the capacity only.
        """
        B, T, _ = c.shape
        cap = state.buf.shape[1]
        pos = seq_lens.to(c.device)[:, None] + torch.arange(T, device=c.device)[None, :]  # [B, T]
        rows = torch.arange(B, device=c.device)[:, None].expand(B, T)
        state.buf.index_put_((rows, pos), c.to(state.buf.dtype))
        j = torch.arange(cap, device=c.device)[None, None, :]
        return state.buf, (j <= pos[:, :, None])[:, None]  # [B, 1, T, cap]

    def new_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> MLAState:
        return MLAState(torch.zeros(batch_size, 0, self.d_c + self.d_r, device=device, dtype=dtype))
