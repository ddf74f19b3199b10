"""The policy loss on policy tokens: PPO's clipped ratio against the rollout's log-probabilities and a
KL penalty to a frozen reference (the k3 estimator), normalised per token.

Per policy token ``t`` with advantage ``A``, current log-prob ``ℓ``, rollout log-prob ``ℓ_old`` and
reference log-prob ``ℓ_ref``::

    ρ    = exp(ℓ − ℓ_old)
    pg   = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A)
    k3   = exp(ℓ_ref − ℓ) − (ℓ_ref − ℓ) − 1          (≥ 0, unbiased for KL(π‖π_ref), 0 when equal)
    loss = pg + β·k3

With a truncated importance-sampling correction (TIS, ``tis`` weights from ``tis_weights``), ``ℓ_old`` is
the trainer's own log-prob before the update and each token's ``pg`` is multiplied by
``w = min(π_old(a) / π_rollout(a), C)``: the tokens were sampled by the engine, whose arithmetic (a
recurrent KDA step, absorbed MLA decode, batched rows) differs from the trainer's in the last bits, so
the samples come from ``π_rollout``, not ``π_old``; ``w`` reweights them, capped so a rare token the
engine under-weighted cannot blow up the gradient. Equal log-probs give ``w = 1`` exactly.

Observation tokens (and padding) have mask 0 and contribute nothing. ``norm="token"`` averages over
every policy token of the batch (long turns weigh by their length, as DAPO argues);
``norm="sequence"`` averages each trajectory's tokens first, then the trajectories (GRPO's original).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NORMS = ("token", "sequence")


@dataclass
class LossParts:
    loss: torch.Tensor  # scalar to backpropagate
    pg: float  # policy-gradient part (normalised like the loss)
    kl: float  # mean k3 over policy tokens
    clip_frac: float  # share of policy tokens whose ratio was clipped
    ratio: float  # mean ratio over policy tokens
    tis: float = 1.0  # mean TIS weight over policy tokens (1 without the correction)


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights ``min(exp(ℓ_old − ℓ_rollout), cap)`` (elementwise, no gradient):
    exactly 1 where the two log-probs are bitwise equal."""
    if not cap > 0:
        raise ValueError(f"cap: expected a number > 0, got {cap!r}")
    with torch.no_grad():
        return torch.exp(old_logp - rollout_logp).clamp(max=cap)


def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π ‖ π_ref) from log-probs of the sampled tokens (elementwise)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    kl_coef: float = 0.0,
    norm: str = "token",
    tis: torch.Tensor | None = None,
) -> LossParts:
    """All inputs ``[B, T]`` (``mask`` bool/0-1: policy tokens; ``tis``: per-token TIS weights or None);
    see the module docstring."""
    if norm not in NORMS:
        raise ValueError(f"norm: expected one of {NORMS}, got {norm!r}")
    m = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg_tok = -torch.minimum(ratio * adv, clipped * adv)
    if tis is not None:
        pg_tok = pg_tok * tis.detach()
    kl_tok = k3(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    per_tok = pg_tok + kl_coef * kl_tok

    def reduce(x: torch.Tensor) -> torch.Tensor:
        if norm == "token":
            return (x * m).sum() / m.sum().clamp_min(1.0)
        rows = m.sum(1) > 0
        per_row = (x * m).sum(1) / m.sum(1).clamp_min(1.0)
        return per_row[rows].sum() / rows.sum().clamp_min(1)

    n = m.sum().clamp_min(1.0)
    with torch.no_grad():
        was_clipped = ((ratio * adv) > (clipped * adv)) & mask.bool()
        stats = (
            float(reduce(pg_tok)),
            float((kl_tok * m).sum() / n),
            float(was_clipped.sum() / n),
            float((ratio * m).sum() / n),
            1.0 if tis is None else float((tis * m).sum() / n),
        )
    return LossParts(reduce(per_tok), *stats)
