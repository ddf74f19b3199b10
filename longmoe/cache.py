"""Per-sequence inference state and the token layout of a forward call.

A ``Cache`` holds, per layer, what that layer needs to continue a sequence: for KDA layers the
fixed-size recurrent state ``[B, H, K, V]`` (fp32) plus the last ``conv_size - 1`` conv inputs; for MLA
layers the latent ``c`` of every past token ``[B, T_cached, d_c]`` (model dtype). Rows are independent
sequences of possibly different lengths (``seq_lens``): MLA rows are left-aligned and zero-padded, and
the per-row length masks the padding, so the serving engine can ``stack`` rows, decode one token for
all of them and ``split`` them again (continuous batching).

``Packing`` describes the other layout: several documents packed into one row (``cu_seqlens``), which
the layers must keep apart (KDA state reset + conv masking, block-diagonal MLA mask).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

_MIN_CAPACITY = 64  # initial MLA latent slots per row; grows by doubling (amortised O(1) appends)


@dataclass
class KDAState:
    """One KDA layer: recurrent state ``[B, H, K, V]`` fp32 and conv tail ``[B, W-1, C]``."""

    state: torch.Tensor
    conv: torch.Tensor

    def tensors(self) -> list[torch.Tensor]:
        return [self.state, self.conv]


@dataclass
class MLAState:
    """One MLA layer: latent buffer ``[B, capacity, d_c]``; row ``b`` is valid up to ``seq_lens[b]``."""

    buf: torch.Tensor

    def ensure_capacity(self, n: int) -> None:
        cap = self.buf.shape[1]
        if n <= cap:
            return
        new_cap = max(n, 2 * cap, _MIN_CAPACITY)
        buf = self.buf.new_zeros(self.buf.shape[0], new_cap, self.buf.shape[2])
        buf[:, :cap] = self.buf
        self.buf = buf


LayerState = KDAState | MLAState


@dataclass
class Cache:
    """Inference state of ``B`` rows for every layer; ``seq_lens [B]`` tokens seen per row."""

    layers: list[LayerState]
    seq_lens: torch.Tensor  # [B] int64

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.numel())

    @property
    def max_len(self) -> int:
        return int(self.seq_lens.max()) if self.batch_size else 0

    def nbytes(self) -> int:
        """Bytes of live state: KDA states + conv tails, and the valid (unpadded) MLA latents."""
        total, n_tokens = 0, int(self.seq_lens.sum())
        for st in self.layers:
            if isinstance(st, KDAState):
                total += sum(t.numel() * t.element_size() for t in st.tensors())
            else:
                total += n_tokens * st.buf.shape[2] * st.buf.element_size()
        return total

    def advance(self, n: int) -> None:
        """Record that every row consumed ``n`` more tokens (called by the model after all layers)."""
        self.seq_lens = self.seq_lens + n

    def to(self, device: torch.device | str) -> Cache:
        out = []
        for st in self.layers:
            if isinstance(st, KDAState):
                out.append(KDAState(st.state.to(device), st.conv.to(device)))
            else:
                out.append(MLAState(st.buf.to(device)))
        return Cache(out, self.seq_lens.to(device))

    def clone(self) -> Cache:
        out: list[LayerState] = []
        n = self.max_len
        for st in self.layers:
            if isinstance(st, KDAState):
                out.append(KDAState(st.state.clone(), st.conv.clone()))
            else:
                out.append(MLAState(st.buf[:, :n].clone()))
        return Cache(out, self.seq_lens.clone())

    @staticmethod
    def stack(caches: list[Cache]) -> Cache:
        """Concatenate the rows of several caches (same model) into one batch; MLA rows padded."""
        if not caches:
            raise ValueError("Cache.stack: expected a non-empty list of caches")
        n_layers = len(caches[0].layers)
        for c in caches:
            if len(c.layers) != n_layers or any(
                type(a) is not type(b) for a, b in zip(c.layers, caches[0].layers, strict=True)
            ):
                raise ValueError("Cache.stack: all caches must come from the same model (layer layout)")
        seq_lens = torch.cat([c.seq_lens for c in caches])
        n = int(seq_lens.max()) if seq_lens.numel() else 0
        out: list[LayerState] = []
        for i, st0 in enumerate(caches[0].layers):
            if isinstance(st0, KDAState):
                out.append(
                    KDAState(
                        torch.cat([c.layers[i].state for c in caches]),
                        torch.cat([c.layers[i].conv for c in caches]),
                    )
                )
            else:
                parts = []
                for c in caches:
                    b = c.layers[i].buf[:, :n]
                    if b.shape[1] < n:
                        b = torch.cat([b, b.new_zeros(b.shape[0], n - b.shape[1], b.shape[2])], dim=1)
                    parts.append(b)
                out.append(MLAState(torch.cat(parts)))
        return Cache(out, seq_lens)

    def split(self) -> list[Cache]:
        """One single-row cache per row (MLA latents trimmed to that row's length and copied)."""
        rows = []
        for b in range(self.batch_size):
            n = int(self.seq_lens[b])
            layers: list[LayerState] = []
            for st in self.layers:
                if isinstance(st, KDAState):
                    layers.append(KDAState(st.state[b : b + 1].clone(), st.conv[b : b + 1].clone()))
                else:
                    layers.append(MLAState(st.buf[b : b + 1, :n].clone()))
            rows.append(Cache(layers, self.seq_lens[b : b + 1].clone()))
        return rows


@dataclass
class Packing:
    """Documents packed in one row: ``cu_seqlens [N+1]`` offsets, derived per-token layout."""

    cu_seqlens: torch.Tensor  # [N+1] int64
    doc_pos: torch.Tensor = field(init=False)  # [T] position of each token inside its document
    doc_id: torch.Tensor = field(init=False)  # [T] document index of each token

    def __post_init__(self) -> None:
        cu = self.cu_seqlens.long()
        T = int(cu[-1])
        t = torch.arange(T, device=cu.device)
        self.doc_id = torch.searchsorted(cu[1:], t, right=True)  # [T]
        self.doc_pos = t - cu[self.doc_id]
