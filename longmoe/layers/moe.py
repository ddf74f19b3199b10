"""Sparse MoE feed-forward with a latent expert space and aux-loss-free balancing (docs/design.md §1.5).

    s  = sigmoid(x W_rᵀ)                         router in full width, [N, E] (backward: only s_S)
    S  = top-k(s + b)                            b: balancing bias buffer (selection only, no grad)
    w  = routed_scale · s_S / Σ s_S              combine weights from the unbiased scores
    z  = W_down x                                latent ℓ = d / α (identity when α = 1)
    y  = W_up Σ_{e∈S} w_e GLU_e(z) + Σ_shared GLU(x)

Routed experts are stored as 3-D tensors (``w_in [E, ℓ, 2f]`` gate|up fused, ``w_out [E, f, ℓ]``) so
expert parallelism can shard dimension 0. Dispatch is dropless (``ops/moe``). Balancer state
(bias, the windowed load ring, the current step's counts) lives in persistent buffers, so a checkpoint
of ``state_dict()`` resumes balancing exactly.

One seam lets ``distributed/expert_parallel.py`` parallelise the layer from outside (the model never
imports ``torch.distributed``): ``expert_dispatch``, ``None`` by default, replaces the local routed-expert
call with an all-to-all over expert-parallel ranks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from longmoe.config import FFNConfig
from longmoe.layers import balance
from longmoe.layers.mlp import GLUMLP
from longmoe.layers.quant import QuantExperts
from longmoe.layers.shapes import shape_static
from longmoe.ops.moe import (
    DECODE_MAX_PAIRS,
    combine_weights,
    decode_experts,
    dispatch_experts,
    gather_experts,
    gathered_reduction,
    one_token_compiled,
    route,
    selected_logits,
)

PARAM_KEYS = ("router", "latent_proj", "routed_experts", "shared_experts")
ENTROPY_TOKENS = 512  # tokens per forward the router-entropy metric is estimated on
# static shapes, many pairs (a compiled prefill): the sorted dispatch runs eagerly between compiled
# pieces; tracing its routing-dependent layout (Python loops over counts) only makes graph fragments
_dispatch_untraced = torch.compiler.disable(dispatch_experts)

# (z [N, ℓ], idx [N, k], weights [N, k], w_in [E, ℓ, 2f], w_out [E, f, ℓ]) -> y [N, ℓ]
ExpertDispatch = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]


class MoELayer(nn.Module):
    """The MoE FFN: ``forward(x [..., d]) -> [..., d]``; balancing via ``aux_loss`` / ``update_balance``."""

    def __init__(self, d_model: int, ffn: FFNConfig, *, impl: str = "bmm", init_std: float = 0.02) -> None:
        super().__init__()
        ffn.validate(d_model)
        self.d_model, self.cfg, self.impl = d_model, ffn, impl
        E, f = ffn.n_experts, ffn.expert_hidden
        l = ffn.latent_dim(d_model)
        self.latent = l
        self.router = nn.Linear(d_model, E, bias=False)  # router.weight [E, d]
        if ffn.latent_ratio > 1:
            self.down = nn.Linear(d_model, l, bias=False)
            self.up = nn.Linear(l, d_model, bias=False)
        else:
            self.down = self.up = None
        self.w_in = nn.Parameter(torch.empty(E, l, 2 * f))  # [E, ℓ, 2f] gate|up
        self.w_out = nn.Parameter(torch.empty(E, f, l))  # [E, f, ℓ]
        # the n_shared full-width experts fused into one GLU of width n_shared · shared_hidden (a sum of
        # GLUs over disjoint hidden units is one GLU): the dense MLP's module, 3 · d · shared_hidden each
        sh = ffn.n_shared * ffn.shared_hidden
        self.shared = GLUMLP(d_model, sh, ffn.glu) if ffn.n_shared else None
        # balancer state: all persistent, all in state_dict()
        self.register_buffer("bias", torch.zeros(E))  # selection bias b [E]
        self.register_buffer("load_window", torch.zeros(ffn.balance_window, E))  # ring of step counts
        self.register_buffer("window_pos", torch.zeros((), dtype=torch.long))  # next ring slot
        self.register_buffer("balance_steps", torch.zeros((), dtype=torch.long))  # update_balance calls
        self.register_buffer("step_counts", torch.zeros(E))  # pairs per expert since last update
        self.register_buffer("step_entropy", torch.zeros(2))  # [Σ token entropy, tokens] since last update
        self.register_buffer("last_entropy", torch.zeros(()))
        self.aux_loss: torch.Tensor = torch.zeros(())
        self.expert_dispatch: ExpertDispatch | None = None  # the seam (module docstring); None = local
        # set by longmoe/quantize.py: the routed experts packed per expert (w_in / w_out become None)
        self.quant_experts: QuantExperts | None = None
        # static shapes (torch.compile'd decode): few pairs go through gather_experts, which has no
        # data-dependent shapes; the sorted dispatch's layout depends on the routing
        self.static_shapes = False
        # fine-tuning guard (train/drift.freeze_routing): update_balance keeps the selection bias
        self.freeze_bias = False
        self.reset_parameters(init_std)

    def reset_parameters(self, std: float = 0.02) -> None:
        for p in self.parameters():
            nn.init.normal_(p, 0.0, std)

    # ------------------------------------------------------------------------------------------ accounting
    @staticmethod
    def analytic_param_counts(d_model: int, ffn: FFNConfig) -> dict[str, int]:
        """Total parameters of one MoE layer by part (what ``longmoe inspect`` reports)."""
        E, f, l = ffn.n_experts, ffn.expert_hidden, ffn.latent_dim(d_model)
        return {
            "router": E * d_model,
            "latent_proj": 2 * d_model * l if ffn.latent_ratio > 1 else 0,
            "routed_experts": E * 3 * l * f,
            "shared_experts": ffn.n_shared * 3 * d_model * ffn.shared_hidden,
        }

    @staticmethod
    def active_param_counts(d_model: int, ffn: FFNConfig) -> dict[str, int]:
        """Parameters one token touches: the full router, the projections, ``top_k`` experts, shared."""
        c = MoELayer.analytic_param_counts(d_model, ffn)
        c["routed_experts"] = ffn.top_k * 3 * ffn.latent_dim(d_model) * ffn.expert_hidden
        return c

    # ------------------------------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xf = x.reshape(-1, self.d_model)  # [N, d]
        cfg = self.cfg
        aux = self.training and cfg.balancer == "aux"
        W_r = self.router.weight  # [E, d]
        # the router is fp32 even under autocast (which would run F.linear in bf16 and round the logits)
        # (entered only when on: an autocast region in a compiled graph bypasses AOTAutograd's disk cache)
        dev = xf.device.type
        on = torch.is_autocast_enabled(dev)
        no_autocast = torch.autocast(device_type=dev, enabled=False) if on else contextlib.nullcontext()
        with torch.set_grad_enabled(aux and torch.is_grad_enabled()), no_autocast:
            logits = F.linear(xf.float(), W_r.float())  # [N, E] router in fp32
            scores, idx, w = route(
                logits,
                self.bias,
                cfg.top_k,
                cfg.routed_scale,
                cfg.n_group,
                cfg.topk_group,
                shape_static(self),
            )
        if not aux and torch.is_grad_enabled() and (xf.requires_grad or W_r.requires_grad):
            # only the aux loss needs gradient through all E scores; the combine weights need it
            # through the k selected logits, so the router backward is O(N·k·d), not O(N·E·d)
            sel = torch.sigmoid(selected_logits(xf, W_r, logits, idx))  # [N, k]
            w = combine_weights(sel, cfg.routed_scale)
        z = self.down(xf) if self.down is not None else xf  # [N, ℓ]
        # under autocast z arrives in bf16: run the experts in z's dtype (a differentiable cast, as
        # autocast does for nn.Linear), since the custom-autograd dispatch writes into z-typed buffers
        y = self._experts(z, idx, w.to(z.dtype))  # [N, ℓ]
        if self.up is not None:
            y = self.up(y)  # [N, d]
        if self.shared is not None:
            y = y + self.shared(xf)
        if self.training:
            with torch.no_grad():
                self.step_counts += torch.bincount(idx.reshape(-1), minlength=cfg.n_experts).to(
                    self.step_counts.dtype
                )
                # a monitoring statistic: estimated on an evenly strided sample of ≤ ENTROPY_TOKENS
                # tokens (the full [N, E] log pass cost 5-6% of a bf16 forward at E = 896)
                stride = -(-xf.shape[0] // ENTROPY_TOKENS)
                ent = balance.router_entropy(scores.detach()[::stride])
                self.step_entropy += torch.stack([ent * xf.shape[0], ent.new_tensor(float(xf.shape[0]))])
            if cfg.balancer == "aux":
                self.aux_loss = balance.aux_balance_loss(scores, idx, cfg.n_experts, cfg.aux_loss_coef)
            else:
                self.aux_loss = scores.new_zeros(())
        else:
            self.aux_loss = scores.new_zeros(())
        return y.reshape(shape).to(x.dtype)

    def _experts(self, z: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if self.quant_experts is not None:
            return self.quant_experts(z, idx, w)
        w_in, w_out = self.w_in.to(z.dtype), self.w_out.to(z.dtype)
        if self.expert_dispatch is not None:  # the seam (expert parallel)
            return self.expert_dispatch(z, idx, w, w_in, w_out)
        grad = torch.is_grad_enabled() and (z.requires_grad or w.requires_grad or w_in.requires_grad)
        if not grad and one_token_compiled(z):  # a compiled batch-1 CPU step: threaded reductions
            return gathered_reduction(z, idx, w, w_in, w_out, self.cfg.glu)
        static = shape_static(self)
        # decode: the chosen experts' weights only. Under static shapes (a compiled step) at *any* pair
        # count: the batch is symbolic there, and a branch on N·k would guard it, so a batch past
        # DECODE_MAX_PAIRS / k would recompile into the untraced dispatch, which fullgraph refuses (the
        # failure `--compile` serving hit at 32 clients with top-4 routing). The op is one opaque node.
        if not grad and (static or idx.numel() <= DECODE_MAX_PAIRS):
            return decode_experts(z, idx, w, w_in, w_out, self.cfg.glu)
        if static and idx.numel() <= DECODE_MAX_PAIRS:  # the same, with autograd: gathered
            return gather_experts(z, idx, w, w_in, w_out, self.cfg.glu)
        if static:
            return _dispatch_untraced(z, idx, w, w_in, w_out, self.cfg.glu, self.impl)
        return dispatch_experts(z, idx, w, w_in, w_out, self.cfg.glu, self.impl)

    # ------------------------------------------------------------------------------------------ balancing
    @property
    def load(self) -> torch.Tensor:
        """Windowed running load per expert: pairs routed over the last ``balance_window`` steps. [E]"""
        return self.load_window.sum(0)

    @torch.no_grad()
    def update_balance(self) -> None:
        """After an optimizer step: fold the step's counts into the window, move the bias, reset counts."""
        cfg = self.cfg
        pos = int(self.window_pos)
        self.load_window[pos] = self.step_counts
        self.window_pos.fill_((pos + 1) % cfg.balance_window)
        self.balance_steps += 1
        load = self.load
        if float(load.sum()) > 0 and not self.freeze_bias:
            if cfg.balancer == "quantile":
                self.bias.copy_(balance.quantile_update(self.bias, load, cfg.bias_step, cfg.balance_quantile))
            elif cfg.balancer == "sign":
                self.bias.copy_(balance.sign_update(self.bias, load, cfg.bias_step))
        if float(self.step_entropy[1]) > 0:
            self.last_entropy.fill_(float(self.step_entropy[0] / self.step_entropy[1]))
        self.discard_step_counts()

    def discard_step_counts(self) -> None:
        """A step that was not taken: forget its counts, leave the window and the bias as they are."""
        self.step_counts.zero_()
        self.step_entropy.zero_()

    def balance_metrics(self) -> dict:
        """``max_vio``, ``dead_experts`` (no tokens in the window), ``router_entropy`` (nats, of the last
        step), ``load`` (the windowed load normalised to sum 1) for the trainer's logs."""
        load = self.load
        if float(load.sum()) == 0:  # nothing folded yet: report the current step
            load = self.step_counts
        total = float(load.sum())
        return {
            "max_vio": balance.max_vio(load),
            "dead_experts": int((load == 0).sum()) if total > 0 else 0,
            "router_entropy": float(self.last_entropy),
            "load": (load / total).tolist() if total > 0 else [0.0] * self.cfg.n_experts,
        }
