"""Image patches → embeddings in the language model's width: the vision side of native image input.

An image arrives as ``Patches``: its pixels cut into a ``rows × cols`` grid of ``P × P`` patches in
row-major order (``longmoe.data.images.patchify`` makes them). ``VisionEncoder`` turns a list of
them into one embedding per patch, ``[Σ rows·cols, d_model]``, which the model writes into the
``<|image_patch|>`` positions of the token stream (``LongMoE.forward(image_embeds=)``).

Position signal: the text stack has no positional encoding (order comes from the causal KDA
recurrences), and a row-major run of patches read causally does not tell the model where a row
ends. Each patch therefore gets a learned row embedding plus a learned column embedding
(factorised 2-D: ``2 · max_grid`` vectors instead of ``max_grid²``, and a patch at row r means the
same at any image width). The ViT option adds them before its bidirectional layers, so every patch
also sees the whole image before the causal stack reads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from longmoe.config import VisionConfig
from longmoe.layers.mlp import GLUMLP
from longmoe.layers.norm import RMSNorm
from longmoe.types import Patches

PIXEL_MEAN = 0.5  # pixels in [0, 1] are centred before the patch projection


class ViTBlock(nn.Module):
    """Pre-norm transformer layer over the patches of one image: bidirectional attention + SwiGLU."""

    def __init__(self, cfg: VisionConfig, eps: float) -> None:
        super().__init__()
        w = cfg.width
        self.heads = cfg.heads
        self.attn_norm = RMSNorm(w, eps)
        self.qkv = nn.Linear(w, 3 * w, bias=False)
        self.o_proj = nn.Linear(w, w, bias=False)
        self.mlp_norm = RMSNorm(w, eps)
        self.mlp = GLUMLP(w, cfg.mlp_ratio * w)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        # x: [I, L, w] (I images padded to L patches); key_mask: [I, L] True = a real patch
        I, L, w = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(I, L, 3, self.heads, w // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [I, H, L, w/H]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        x = x + self.o_proj(o.transpose(1, 2).reshape(I, L, w))
        return x + self.mlp(self.mlp_norm(x))

    @staticmethod
    def param_count(cfg: VisionConfig) -> int:
        w = cfg.width
        return 2 * w + 4 * w * w + GLUMLP.param_count(w, cfg.mlp_ratio * w)


class VisionEncoder(nn.Module):
    """``list[Patches]`` → ``[Σ rows·cols, d_model]``: patch projection + row/column embeddings
    (+ ViT layers with ``encoder="vit"``), images in order, each row-major."""

    def __init__(self, cfg: VisionConfig, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.cfg, self.d_model = cfg, d_model
        width = d_model if cfg.encoder == "linear" else cfg.width
        self.patch_proj = nn.Linear(cfg.patch_dim, width, bias=False)
        self.row_embed = nn.Embedding(cfg.max_grid, width)
        self.col_embed = nn.Embedding(cfg.max_grid, width)
        if cfg.encoder == "vit":
            self.blocks = nn.ModuleList(ViTBlock(cfg, eps) for _ in range(cfg.depth))
            self.out_norm = RMSNorm(width, eps)
            self.out_proj = nn.Linear(width, d_model, bias=False)

    @torch.no_grad()
    def init_weights(self, std: float) -> None:
        """Projections ``N(0, std)`` (residual-writing ViT projections ``std / sqrt(2·depth)``), position
        embeddings ``N(0, std)``, norms 1: the text stack's scheme (model.py)."""
        out_std = std / math.sqrt(2 * self.cfg.depth)
        for m in (self.patch_proj, self.row_embed, self.col_embed):
            nn.init.normal_(m.weight, std=std)
        if self.cfg.encoder == "vit":
            for b in self.blocks:
                nn.init.normal_(b.qkv.weight, std=std)
                nn.init.normal_(b.o_proj.weight, std=out_std)
                nn.init.normal_(b.mlp.w_in.weight, std=std)
                nn.init.normal_(b.mlp.w_out.weight, std=out_std)
                b.attn_norm.weight.fill_(1.0)
                b.mlp_norm.weight.fill_(1.0)
            self.out_norm.weight.fill_(1.0)
            nn.init.normal_(self.out_proj.weight, std=std)

    def check(self, p: Patches, i: int) -> None:
        g, dim = self.cfg.max_grid, self.cfg.patch_dim
        if not isinstance(p, Patches):
            raise TypeError(f"images[{i}]: expected Patches, got {type(p).__name__}")
        if not (1 <= p.rows <= g and 1 <= p.cols <= g):
            raise ValueError(
                f"images[{i}]: a {p.rows}×{p.cols} patch grid is invalid: expected 1..{g} rows and cols "
                f"(vision.max_image_side / vision.patch_size)"
            )
        if tuple(p.pixels.shape) != (p.n, dim):
            raise ValueError(
                f"images[{i}]: pixels have shape {list(p.pixels.shape)}, expected [{p.n}, {dim}] "
                f"(rows·cols, 3·patch_size²)"
            )

    def _positions(self, p: Patches, device: torch.device) -> torch.Tensor:
        r = torch.arange(p.rows, device=device).repeat_interleave(p.cols)  # [n] row of each patch
        c = torch.arange(p.cols, device=device).repeat(p.rows)  # [n] its column
        return self.row_embed(r) + self.col_embed(c)  # [n, width]

    def forward(self, images: Sequence[Patches]) -> torch.Tensor:
        w = self.row_embed.weight  # device and dtype (the projections may be quantized: no .weight)
        if len(images) == 0:
            return w.new_zeros(0, self.d_model)
        for i, p in enumerate(images):
            self.check(p, i)
        xs = [
            self.patch_proj(p.pixels.to(w.device, w.dtype) - PIXEL_MEAN) + self._positions(p, w.device)
            for p in images
        ]  # each [n_i, width]
        if self.cfg.encoder == "linear":
            return torch.cat(xs)  # [N, d_model]
        lens = [x.shape[0] for x in xs]
        x = nn.utils.rnn.pad_sequence(xs, batch_first=True)  # [I, L, width]
        key_mask = (
            torch.arange(x.shape[1], device=w.device)[None, :] < torch.tensor(lens, device=w.device)[:, None]
        )
        for b in self.blocks:
            x = b(x, key_mask)
        x = self.out_proj(self.out_norm(x))  # [I, L, d_model]
        return x[key_mask]  # [N, d_model], images in order, each row-major

    @staticmethod
    def param_count(cfg: VisionConfig, d_model: int) -> int:
        width = d_model if cfg.encoder == "linear" else cfg.width
        n = cfg.patch_dim * width + 2 * cfg.max_grid * width
        if cfg.encoder == "vit":
            n += cfg.depth * ViTBlock.param_count(cfg) + width + width * d_model
        return n
