"""LongMoE: embeddings → hybrid KDA / MLA blocks (each with an FFN) → final norm → LM head.

No positional embedding of any kind: order comes from the causal KDA recurrences. The residual
stream is either block attention residuals (``cfg.attn_res``) or plain pre-norm residuals.

Init (see docs/model.md): every projection ``N(0, init_std)``; the projections that write into the
residual stream (``o_proj`` of both mixers, ``w_out`` of dense MLPs) ``N(0, init_std / sqrt(2·n_layers))``;
embeddings ``N(0, init_std)``; norms 1; AttnRes pseudo-queries 0 (uniform mixing); KDA decay-gate
bias so that per-token log-decays start log-uniform in [-0.1, -0.001]; MoE layers initialise
themselves; the vision encoder (``cfg.vision``) initialises itself the same way, after the text weights.

Images (``layers/vision.py``): ``encode_images`` gives one embedding per patch; ``forward(image_embeds=)``
writes them over the ``<|image_patch|>`` token embeddings, and the shared stack reads them as tokens.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from longmoe.cache import Cache, Packing
from longmoe.config import IGNORE_INDEX, IMAGE_PATCH_TOKEN_ID, ConfigError, ModelConfig
from longmoe.layers.attnres import BlockAttnRes, block_of_layers
from longmoe.layers.ffn import build_ffn
from longmoe.layers.kda import KDALayer
from longmoe.layers.mla import DECODE_PATHS, MLALayer
from longmoe.layers.mlp import GLUMLP
from longmoe.layers.moe import MoELayer
from longmoe.layers.norm import RMSNorm
from longmoe.layers.shapes import dynamic_shapes, shape_static
from longmoe.layers.vision import Patches, VisionEncoder

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T, vocab]
    loss: torch.Tensor | None = None  # ce_loss + aux_loss
    ce_loss: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None
    cache: Cache | None = None


class Block(nn.Module):
    """One layer: a token mixer (KDA or MLA) and an FFN, each behind its own pre-norm."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.kind = cfg.layer_types[layer_idx]
        self.mixer_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer: KDALayer | MLALayer = KDALayer(cfg) if self.kind == "L" else MLALayer(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = build_ffn(cfg, layer_idx)

    def mix(self, h: torch.Tensor, cache: Cache | None, idx: int, packing: Packing | None) -> torch.Tensor:
        x = self.mixer_norm(h)
        state = None if cache is None else cache.layers[idx]
        if self.kind == "L":
            return self.mixer(x, state, packing)
        return self.mixer(x, state, None if cache is None else cache.seq_lens, packing)

    def feed(self, h: torch.Tensor) -> torch.Tensor:
        return self.ffn(self.ffn_norm(h))


class LongMoE(nn.Module):
    """The hybrid language model of ``ModelConfig``; see the module docstring."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg: expected a ModelConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.block_of = block_of_layers(cfg.n_layers, cfg.attn_res_blocks)
        self.attn_res = (
            BlockAttnRes(2 * cfg.n_layers + 1, cfg.d_model, cfg.norm_eps) if cfg.attn_res else None
        )
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.vision: VisionEncoder | None = None
        self.static_shapes = False
        self.init_weights()
        if cfg.vision is not None:  # built after the text weights are drawn: a seed gives the same text
            self.vision = VisionEncoder(cfg.vision, cfg.d_model, cfg.norm_eps)  # stack with or without it
            self.vision.init_weights(cfg.init_std)
        self.to(_DTYPES[cfg.dtype])

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def init_weights(self) -> None:
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.embed.weight, std=std)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=std)
        for b in self.blocks:
            b.mixer.init_weights(std, out_std)
            b.mixer_norm.weight.fill_(1.0)
            b.ffn_norm.weight.fill_(1.0)
            if isinstance(b.ffn, GLUMLP):
                nn.init.normal_(b.ffn.w_in.weight, std=std)
                nn.init.normal_(b.ffn.w_out.weight, std=out_std)
        if self.attn_res is not None:
            self.attn_res.queries.zero_()
        self.final_norm.weight.fill_(1.0)
        if self.vision is not None:
            self.vision.init_weights(std)

    # ------------------------------------------------------------------ helpers
    def moe_layers(self) -> list[nn.Module]:
        return [b.ffn for i, b in enumerate(self.blocks) if self.cfg.is_moe_layer(i)]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())  # shared (tied) parameters are yielded once

    def new_cache(self, batch_size: int, device: torch.device | str | None = None) -> Cache:
        """An empty cache for ``batch_size`` rows (on the model's device unless given)."""
        p = self.embed.weight
        device = p.device if device is None else torch.device(device)
        layers = [b.mixer.new_state(batch_size, device, p.dtype) for b in self.blocks]
        return Cache(layers, torch.zeros(batch_size, dtype=torch.long, device=device))

    def set_mla_decode(self, path: str) -> None:
        """How MLA layers attend against a cache: ``"auto"`` (default: by cost per call, see
        ``MLALayer.cached_path``), ``"absorbed"`` or ``"naive"``."""
        if path not in DECODE_PATHS:
            raise ValueError(f"path: expected one of {DECODE_PATHS}, got {path!r}")
        for b in self.blocks:
            if isinstance(b.mixer, MLALayer):
                b.mixer.decode_path = path

    @staticmethod
    def dynamic_shapes() -> contextlib.AbstractContextManager[None]:
        """Calls inside this block (in this thread) take the eager, length-dependent paths even on a
        shape-static model: a compiled engine's eager prefill (``layers/shapes.py``)."""
        return dynamic_shapes()

    def set_static_shapes(self, on: bool = True) -> None:
        """Shape-static cached calls for ``torch.compile`` (same results): MLA attends over the reserved
        latent capacity with a mask (the caller runs ``cache.reserve(T)`` first), MoE routes without
        data-dependent branches and runs decode-sized batches through ``gather_experts``."""
        self.static_shapes = on  # and no check of image tokens in a call without images (a sync)
        for m in self.modules():
            if isinstance(m, MLALayer | MoELayer):
                m.static_shapes = on

    def token_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``[..., vocab]`` of hidden states ``h`` ``[..., d_model]`` (final norm +
        head): what the model would say on reading ``h``, e.g. a patch embedding (vision_extract's
        patch-reading loss)."""
        return self._head(h)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:  # tied: the embedding table is the head [vocab, d]
            return F.linear(self.final_norm(h), self.embed.weight)
        return self.lm_head(self.final_norm(h))  # an nn.Linear, or a QuantLinear (quantize head=True)

    # ------------------------------------------------------------------ images
    def encode_images(self, images: Sequence[Patches]) -> torch.Tensor:
        """Patch embeddings ``[Σ rows·cols, d_model]`` of ``images`` (in order, each row-major), for
        ``forward(image_embeds=)``; a prompt's images are encoded once and sliced across its calls."""
        if self.vision is None:
            raise ValueError(
                "encode_images: this model has no vision encoder (config field 'vision' is null)"
            )
        return self.vision(images)

    def _embed(self, input_ids: torch.Tensor, image_embeds: torch.Tensor | None) -> torch.Tensor:
        """Token embeddings ``[B, T, d]`` with the ``<|image_patch|>`` positions replaced by
        ``image_embeds`` in row-major (batch row, then time) order."""
        h = self.embed(input_ids)  # [B, T, d]
        if self.vision is None:
            if image_embeds is not None:
                raise ValueError(
                    "image_embeds: this model has no vision encoder (config field 'vision' is null)"
                )
            return h
        if image_embeds is None and shape_static(self):  # a compiled decode step: no data-dependent
            return h  # check (images are only ever in prompts, and the engine never samples them)
        is_patch = (input_ids == IMAGE_PATCH_TOKEN_ID).flatten()  # [B*T]
        n = int(is_patch.sum())
        got = 0 if image_embeds is None else image_embeds.shape[0]
        if n != got or (image_embeds is not None and tuple(image_embeds.shape[1:]) != (self.cfg.d_model,)):
            shape = None if image_embeds is None else list(image_embeds.shape)
            raise ValueError(
                f"image_embeds: input_ids hold {n} <|image_patch|> token(s), so expected a tensor "
                f"[{n}, {self.cfg.d_model}], got {shape}"
            )
        if n == 0:
            return h
        B, T, d = h.shape
        idx = is_patch.nonzero().squeeze(1)  # [n] flat positions, row-major
        return h.reshape(B * T, d).index_copy(0, idx, image_embeds.to(h.dtype)).view(B, T, d)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        cache: Cache | None = None,
        cu_seqlens: torch.Tensor | None = None,
        use_cache: bool = False,
        image_embeds: torch.Tensor | None = None,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        """``input_ids [B, T]``; ``labels [B, T]`` already shifted (-100 = ignored).

        With ``cache`` (or ``use_cache=True``, which starts a new one) the tokens continue the cached
        rows and the cache is updated in place; any split of a sequence into calls gives the same logits.
        ``cu_seqlens [N+1]`` packs documents into one row (``B == 1``) without leaking across them.
        ``image_embeds [n, d]`` (``encode_images``) fill this call's ``n`` ``<|image_patch|>`` positions in
        row-major order; a model with a vision encoder needs exactly one embedding per such position.
        ``logits_to_keep = n > 0`` runs the head on the last ``n`` positions only (``logits [B, n, V]``): a
        prefill needs one row, and the head on every prompt position is a quarter of a 0.3B model's
        prefill FLOPs at a 32K vocabulary.
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
            raise ValueError(
                f"input_ids: expected a LongTensor [B, T], got {getattr(input_ids, 'shape', None)}"
            )
        B, T = input_ids.shape
        if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, int) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep: expected an int >= 0 (0 = all), got {logits_to_keep!r}")
        if logits_to_keep and labels is not None:
            raise ValueError("logits_to_keep: the loss needs every position's logits; pass 0 with labels")
        packing = None
        if cu_seqlens is not None:
            if cache is not None or use_cache:
                raise ValueError("cu_seqlens: packed documents cannot be combined with a cache")
            if B != 1 or cu_seqlens.dim() != 1 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != T:
                raise ValueError(
                    f"cu_seqlens: expected offsets [0, ..., T={T}] with B = 1, got B = {B}, "
                    f"cu_seqlens = {cu_seqlens.tolist()[:8]}"
                )
            packing = Packing(cu_seqlens.to(input_ids.device).long())
        if cache is None and use_cache:
            cache = self.new_cache(B, input_ids.device)
        if cache is not None and cache.batch_size != B:
            raise ValueError(f"cache: holds {cache.batch_size} rows but input_ids has B = {B}")

        h = self._embed(input_ids, image_embeds)  # [B, T, d]
        if self.attn_res is None:
            for i, b in enumerate(self.blocks):
                h = h + b.mix(h, cache, i, packing)
                h = h + b.feed(h)
        else:
            h = self._forward_attn_res(h, cache, packing)
        logits = self._head(h[:, -logits_to_keep:] if logits_to_keep else h)  # [B, T or n, vocab]
        if cache is not None:
            cache.advance(T)

        out = ModelOutput(logits=logits, cache=cache)
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels: expected shape {list(input_ids.shape)}, got {list(labels.shape)}")
            ce = F.cross_entropy(
                logits.float().view(B * T, -1), labels.reshape(-1), ignore_index=IGNORE_INDEX
            )
            aux = logits.new_zeros((), dtype=torch.float32)
            for m in self.moe_layers():
                a = getattr(m, "aux_loss", None)
                if self.training and isinstance(a, torch.Tensor):
                    aux = aux + a.float()
            out.ce_loss, out.aux_loss, out.loss = ce, aux, ce + aux
        return out

    def _forward_attn_res(
        self, emb: torch.Tensor, cache: Cache | None, packing: Packing | None
    ) -> torch.Tensor:
        ar = self.attn_res
        assert ar is not None
        values, keys = [emb], [ar.keys(emb)]  # finished blocks b_0 (embedding), b_1, ...
        partial: torch.Tensor | None = None  # running sum of the current block's sublayer outputs
        q = 0
        for i, b in enumerate(self.blocks):
            if i > 0 and self.block_of[i] != self.block_of[i - 1] and partial is not None:
                values.append(partial)
                keys.append(ar.keys(partial))
                partial = None
            for sub in (0, 1):
                if partial is None:
                    h = ar(q, values, keys)
                else:
                    h = ar(q, values + [partial], keys + [ar.keys(partial)])
                y = b.mix(h, cache, i, packing) if sub == 0 else b.feed(h)
                partial = y if partial is None else partial + y
                q += 1
        assert partial is not None
        return ar(q, values + [partial], keys + [ar.keys(partial)])

    # ------------------------------------------------------------------ I/O
    def save_pretrained(self, path: str | Path) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (tied weights stored once) into ``path``."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.cfg.save(path / CONFIG_FILE)
        sd = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(sd, str(path / WEIGHTS_FILE), metadata={"format": "pt", "longmoe": "1"})
        return path

    @classmethod
    def from_pretrained(cls, path: str | Path, device: torch.device | str = "cpu") -> LongMoE:
        """Load a directory written by ``save_pretrained``; errors name the missing/mismatched piece."""
        from safetensors.torch import load_file

        path = Path(path)
        cfg_file, w_file = path / CONFIG_FILE, path / WEIGHTS_FILE
        if not path.is_dir():
            raise FileNotFoundError(f"model directory not found: {path}")
        for f in (cfg_file, w_file):
            if not f.is_file():
                raise FileNotFoundError(
                    f"{f} is missing: a model directory needs {CONFIG_FILE} + {WEIGHTS_FILE}"
                )
        try:
            cfg = ModelConfig.load(cfg_file)
        except (TypeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{cfg_file}: {e}") from e
        model = cls(cfg)
        try:
            sd = load_file(str(w_file), device=str(device))
        except Exception as e:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"{w_file} is not a readable safetensors file: {e}") from e
        own = model.state_dict()
        missing = sorted(set(own) - set(sd))
        unexpected = sorted(set(sd) - set(own))
        bad = sorted(k for k in set(own) & set(sd) if own[k].shape != sd[k].shape)
        if missing or unexpected or bad:
            detail = "; ".join(
                f"{name}: {keys[:5]}{' ...' if len(keys) > 5 else ''}"
                for name, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", bad))
                if keys
            )
            raise ValueError(f"{w_file} does not match {cfg_file} ({detail})")
        model.load_state_dict(sd)
        return model.to(device)
