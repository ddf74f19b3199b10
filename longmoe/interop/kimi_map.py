"""Which transformers Kimi-Linear tensor is which piece of which longmoe tensor (both directions).

The map is keyed by the names transformers *saves* (Moonshot's layout: ``self_attn.q_conv1d``,
``block_sparse_moe.experts.N.w1``, ...); ``canonical_pieces`` turns transformers' runtime layout
(``conv1d``, ``forget_gate.*``, ``mlp.experts.gate_up_proj``) into that layout first.

longmoe fuses what Kimi-Linear keeps apart: a KDA layer's ``in_proj`` rows are
``q | k | v | b (β) | f_a (decay-gate rank) | g_a (output-gate rank)``, its ``conv_weight`` rows
``q | k | v``; an MLA layer's ``in_proj`` rows are ``q_a`` (or the full-rank ``q_proj``) ``| kv_a``
(``kv_a_proj_with_mqa``: the latent, then the shared key part ``qk_rope_head_dim`` = ``mla_shared_key_dim``);
a GLU's ``w_in`` rows are ``gate | up``; routed experts are ``w_in [E, d, 2f]`` / ``w_out [E, f, d]``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from longmoe.config import ModelConfig

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Piece:
    """Where one transformers tensor goes inside the longmoe tensor ``target``.

    ``rows``: a block of the target's rows (fused projections); ``expert``: ``(e, "w1"|"w2"|"w3")``, one
    expert's gate / down / up matrix, transposed into ``w_in [E, d, 2f]`` / ``w_out [E, f, d]``; ``kv``:
    ``(H, Dq, Dv)``, ``kv_b_proj``'s per-head ``[k_h | v_h]`` rows regrouped as all keys then all values;
    none of them: the whole tensor, reshaped (e.g. ``A_log [1, 1, H, 1]`` <-> ``A [H, 1]``).
    """

    target: str
    rows: tuple[int, int] | None = None
    expert: tuple[int, str] | None = None
    kv: tuple[int, int, int] | None = None

    def write(self, out: torch.Tensor, src: torch.Tensor) -> None:
        """Copy the transformers tensor ``src`` into its place in the longmoe buffer ``out``."""
        if self.rows is not None:
            lo, hi = self.rows
            out[lo:hi].copy_(src.reshape(hi - lo, *out.shape[1:]))
        elif self.expert is not None:
            e, part = self.expert
            if part == "w2":  # down [d, f] -> w_out[e] [f, d]
                out[e].copy_(src.t())
            else:  # gate (w1) / up (w3) [f, d] -> w_in[e] [d, 2f] halves
                f = out.shape[-1] // 2
                half = out[e, :, :f] if part == "w1" else out[e, :, f:]
                half.copy_(src.t())
        elif self.kv is not None:
            H, Dq, Dv = self.kv
            w = src.reshape(H, Dq + Dv, -1)
            out.copy_(torch.cat([w[:, :Dq].reshape(H * Dq, -1), w[:, Dq:].reshape(H * Dv, -1)]))
        else:
            out.copy_(src.reshape(out.shape))

    def read(self, t: torch.Tensor, shape: Shape) -> torch.Tensor:
        """The inverse of ``write``: this piece, in transformers' ``shape``, out of the longmoe ``t``."""
        if self.rows is not None:
            return t[self.rows[0] : self.rows[1]].reshape(shape)
        if self.expert is not None:
            e, part = self.expert
            if part == "w2":
                return t[e].t()
            f = t.shape[-1] // 2
            return (t[e, :, :f] if part == "w1" else t[e, :, f:]).t()
        if self.kv is not None:
            H, Dq, Dv = self.kv
            k, v = t[: H * Dq].reshape(H, Dq, -1), t[H * Dq :].reshape(H, Dv, -1)
            return torch.cat([k, v], dim=1).reshape(shape)
        return t.reshape(shape)


def source_map(cfg: ModelConfig) -> dict[str, tuple[Piece, Shape]]:
    """Every transformers tensor of ``cfg``'s model -> (its piece of a longmoe tensor, its own shape)."""
    H, K, d, W = cfg.kda_heads, cfg.kda_head_dim, cfg.d_model, cfg.kda_conv_size
    Hm, Dq, Dv = cfg.mla_heads, cfg.mla_head_dim, cfg.mla_v_head_dim
    Dk = Dq + cfg.mla_shared_key_dim  # a query head: the latent-keyed part, then the shared-key part
    rq, dc, f = cfg.mla_q_lora_rank, cfg.mla_kv_lora_rank, cfg.ffn
    m: dict[str, tuple[Piece, Shape]] = {
        "model.embed_tokens.weight": (Piece("embed.weight"), (cfg.vocab_size, d)),
        "model.norm.weight": (Piece("final_norm.weight"), (d,)),
    }
    if not cfg.tie_embeddings:
        m["lm_head.weight"] = (Piece("lm_head.weight"), (cfg.vocab_size, d))

    def rows(name: str, target: str, lo: int, n: int) -> int:
        m[name] = (Piece(target, rows=(lo, lo + n)), (n, d))
        return lo + n

    def whole(name: str, target: str, shape: Shape) -> None:
        m[name] = (Piece(target), shape)

    for i, kind in enumerate(cfg.layer_types):
        p, b = f"model.layers.{i}.", f"blocks.{i}."
        whole(p + "input_layernorm.weight", b + "mixer_norm.weight", (d,))
        whole(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", (d,))
        a, x = p + "self_attn.", b + "mixer."
        if kind == "L":
            hk, r, ro = H * K, cfg.kda_gate_rank, cfg.kda_out_gate_rank
            lo = 0
            for n, size in (("q", hk), ("k", hk), ("v", hk), ("b", H), ("f_a", r), ("g_a", ro)):
                lo = rows(f"{a}{n}_proj.weight", x + "in_proj.weight", lo, size)
            for j, n in enumerate("qkv"):
                m[f"{a}{n}_conv1d.weight"] = (
                    Piece(x + "conv_weight", rows=(j * hk, (j + 1) * hk)),
                    (hk, 1, W),
                )
            whole(a + "f_b_proj.weight", x + "gate_up.weight", (hk, r))
            whole(a + "dt_bias", x + "gate_up.bias", (hk,))
            whole(a + "A_log", x + "A", (1, 1, H, 1))
            whole(a + "g_b_proj.weight", x + "out_gate_up.weight", (hk, ro))
            whole(a + "o_norm.weight", x + "out_norm.weight", (K,))
            whole(a + "o_proj.weight", x + "o_proj.weight", (d, hk))
        else:
            if rq:
                lo = rows(a + "q_a_proj.weight", x + "in_proj.weight", 0, rq)
                whole(a + "q_a_layernorm.weight", x + "q_norm.weight", (rq,))
                whole(a + "q_b_proj.weight", x + "q_up.weight", (Hm * Dk, rq))
            else:
                lo = rows(a + "q_proj.weight", x + "in_proj.weight", 0, Hm * Dk)
            rows(a + "kv_a_proj_with_mqa.weight", x + "in_proj.weight", lo, dc + cfg.mla_shared_key_dim)
            whole(a + "kv_a_layernorm.weight", x + "kv_norm.weight", (dc,))
            m[a + "kv_b_proj.weight"] = (Piece(x + "kv_up.weight", kv=(Hm, Dq, Dv)), (Hm * (Dq + Dv), dc))
            whole(a + "o_proj.weight", x + "o_proj.weight", (d, Hm * Dv))
        mp, fx = p + "block_sparse_moe.", b + "ffn."
        if cfg.is_moe_layer(i):
            whole(mp + "gate.weight", fx + "router.weight", (f.n_experts, d))
            whole(mp + "gate.e_score_correction_bias", fx + "bias", (f.n_experts,))
            fe = f.expert_hidden
            for e in range(f.n_experts):
                for part, shape in (("w1", (fe, d)), ("w2", (d, fe)), ("w3", (fe, d))):
                    target = fx + ("w_out" if part == "w2" else "w_in")
                    m[f"{mp}experts.{e}.{part}.weight"] = (Piece(target, expert=(e, part)), shape)
            if f.n_shared:
                sh = f.n_shared * f.shared_hidden
                lo = rows(mp + "shared_experts.gate_proj.weight", fx + "shared.w_in.weight", 0, sh)
                rows(mp + "shared_experts.up_proj.weight", fx + "shared.w_in.weight", lo, sh)
                whole(mp + "shared_experts.down_proj.weight", fx + "shared.w_out.weight", (d, sh))
        else:
            lo = rows(mp + "gate_proj.weight", fx + "w_in.weight", 0, f.dense_hidden)
            rows(mp + "up_proj.weight", fx + "w_in.weight", lo, f.dense_hidden)
            whole(mp + "down_proj.weight", fx + "w_out.weight", (d, f.dense_hidden))
    return m


_RUNTIME_RENAMES = (  # transformers' runtime names -> the saved layout's (one-to-one renames)
    (re.compile(r"\.mlp\."), ".block_sparse_moe."),
    (re.compile(r"\.self_attn\.forget_gate\."), ".self_attn."),
)


def canonical_pieces(name: str, t: torch.Tensor, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """A tensor as the saved layout's tensors: renamed, and transformers' fused runtime tensors
    (``conv1d``, ``experts.gate_up_proj [E, 2f, d]``, ``experts.down_proj [E, d, f]``) split."""
    for pat, rep in _RUNTIME_RENAMES:
        name = pat.sub(rep, name)
    if name.endswith(".self_attn.conv1d.weight"):
        hk, base = cfg.kda_heads * cfg.kda_head_dim, name[: -len("conv1d.weight")]
        for j, n in enumerate("qkv"):
            yield f"{base}{n}_conv1d.weight", t[j * hk : (j + 1) * hk]
    elif name.endswith(".experts.gate_up_proj"):
        base, fe = name[: -len("gate_up_proj")], cfg.ffn.expert_hidden
        for e in range(t.shape[0]):
            yield f"{base}{e}.w1.weight", t[e, :fe]
            yield f"{base}{e}.w3.weight", t[e, fe:]
    elif name.endswith(".experts.down_proj"):
        base = name[: -len("down_proj")]
        for e in range(t.shape[0]):
            yield f"{base}{e}.w2.weight", t[e]
    else:
        yield name, t


def target_map(cfg: ModelConfig) -> dict[str, list[tuple[str, Piece, Shape]]]:
    """The inverse of ``source_map``: longmoe tensor -> the transformers tensors it holds."""
    inv: dict[str, list[tuple[str, Piece, Shape]]] = {}
    for hf_name, (piece, shape) in source_map(cfg).items():
        inv.setdefault(piece.target, []).append((hf_name, piece, shape))
    return inv
