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

A linear projection sees a glyph that straddles a patch border as a different vector at every
sub-patch offset, and only the part inside the patch. The conv option (``ConvPatchFeatures``)
convolves the whole page at full resolution first and gives each patch a window of half a patch
around it, so the patch that holds a glyph's centre sees all of it wherever it sits
(docs/vision.md, "Off the copy plateau").
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


class ConvPatchFeatures(nn.Module):
    """``list[Patches]`` → ``[Σ rows·cols, width]``: ``depth`` 3×3 convolutions (GELU) over each whole
    page at full resolution, then a ``2P × 2P`` convolution of stride ``P`` (a patch plus ``P/2`` on
    every side) and an RMS norm per patch feature, so content is not drowned by the position tables."""

    def __init__(self, cfg: VisionConfig, eps: float) -> None:
        super().__init__()
        P, c = cfg.patch_size, cfg.stem_channels
        self.P, self.halo = P, P // 2
        self.stem = nn.ModuleList(nn.Conv2d(3 if i == 0 else c, c, 3, padding=1) for i in range(cfg.depth))
        self.patch = nn.Conv2d(c, cfg.width, P + 2 * self.halo, stride=P, padding=self.halo)
        self.norm = RMSNorm(cfg.width, eps)

    def forward(self, images: Sequence[Patches], ref: torch.Tensor) -> list[torch.Tensor]:
        P = self.P
        H, W = max(p.rows for p in images) * P, max(p.cols for p in images) * P
        x = ref.new_zeros(len(images), 3, H, W)  # [I, 3, H, W] ink (1 - pixel): padding is white paper
        inside = ref.new_zeros(len(images), 1, H, W)  # 1 on each image's own pixels
        for i, p in enumerate(images):  # the inverse of data.images.patchify's cut
            page = p.pixels.to(ref.device, ref.dtype).view(p.rows, p.cols, 3, P, P)
            x[i, :, : p.rows * P, : p.cols * P] = 1.0 - page.permute(2, 0, 3, 1, 4).reshape(3, p.rows * P, -1)
            inside[i, :, : p.rows * P, : p.cols * P] = 1.0
        for conv in self.stem:  # zero outside the page after every layer, as the convolution's own padding
            x = F.gelu(conv(x)) * inside  # is: an image's features do not depend on the batch it came in
        y = self.norm(self.patch(x).permute(0, 2, 3, 1))  # [I, H/P, W/P, width]
        return [y[i, : p.rows, : p.cols].reshape(p.n, -1) for i, p in enumerate(images)]  # each [n_i, width]

    @torch.no_grad()
    def init_weights(self) -> None:
        """Fan-in (Kaiming) normal: GELU-fed stem convolutions with gain sqrt(2), the patch convolution
        with gain 1 (a unit-scale page gives unit-scale features before the norm); biases 0."""
        for conv in self.stem:
            nn.init.kaiming_normal_(conv.weight, nonlinearity="relu")
        nn.init.kaiming_normal_(self.patch.weight, nonlinearity="linear")
        for conv in (*self.stem, self.patch):
            nn.init.zeros_(conv.bias)
        self.norm.weight.fill_(1.0)

    @staticmethod
    def param_count(cfg: VisionConfig) -> int:
        c, k = cfg.stem_channels, cfg.patch_size + 2 * (cfg.patch_size // 2)
        stem = (3 * 9 * c + c) + (cfg.depth - 1) * (c * 9 * c + c)
        return stem + c * k * k * cfg.width + cfg.width + cfg.width

    @staticmethod
    def flops_per_patch(cfg: VisionConfig) -> int:
        """Forward FLOPs per patch (2 per multiply-add): the stem runs at every pixel of the patch."""
        c, k, P = cfg.stem_channels, cfg.patch_size + 2 * (cfg.patch_size // 2), cfg.patch_size
        stem = P * P * 9 * c * (3 + (cfg.depth - 1) * c)
        return 2 * (stem + c * k * k * cfg.width)


class VisionEncoder(nn.Module):
    """``list[Patches]`` → ``[Σ rows·cols, d_model]``: patch projection (or the conv features) +
    row/column embeddings (+ ViT layers with ``encoder="vit"``, a residual GLU MLP and a projection
    with ``encoder="conv"``), images in order, each row-major."""

    def __init__(self, cfg: VisionConfig, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.cfg, self.d_model = cfg, d_model
        width = d_model if cfg.encoder == "linear" else cfg.width
        if cfg.encoder == "conv":
            self.conv = ConvPatchFeatures(cfg, eps)
            self.mlp_norm = RMSNorm(width, eps)
            self.mlp = GLUMLP(width, cfg.mlp_ratio * width)
            self.out_proj = nn.Linear(width, d_model, bias=False)
        else:
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
        embeddings ``N(0, std)``, norms 1: the text stack's scheme (model.py); convolutions fan-in."""
        out_std = std / math.sqrt(2 * self.cfg.depth)
        for m in (self.row_embed, self.col_embed):
            nn.init.normal_(m.weight, std=std)
        if self.cfg.encoder == "conv":
            self.conv.init_weights()
            for m in (self.mlp.w_in, self.mlp.w_out, self.out_proj):
                nn.init.normal_(m.weight, std=std)
            self.mlp_norm.weight.fill_(1.0)
        else:
            nn.init.normal_(self.patch_proj.weight, std=std)
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
        if self.cfg.encoder == "conv":
            feats = self.conv(images, w)
        else:
            feats = [self.patch_proj(p.pixels.to(w.device, w.dtype) - PIXEL_MEAN) for p in images]
        xs = [f + self._positions(p, w.device) for f, p in zip(feats, images)]  # each [n_i, width]
        if self.cfg.encoder == "linear":
            return torch.cat(xs)  # [N, d_model]
        if self.cfg.encoder == "conv":
            x = torch.cat(xs)  # [N, width]
            return self.out_proj(x + self.mlp(self.mlp_norm(x)))  # [N, d_model]
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
        if cfg.encoder == "conv":
            n = ConvPatchFeatures.param_count(cfg) + 2 * cfg.max_grid * width
            return n + width + GLUMLP.param_count(width, cfg.mlp_ratio * width) + width * d_model
        n = cfg.patch_dim * width + 2 * cfg.max_grid * width
        if cfg.encoder == "vit":
            n += cfg.depth * ViTBlock.param_count(cfg) + width + width * d_model
        return n
