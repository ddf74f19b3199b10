"""What the long-horizon agent recipe runs: the agent recipe's stages and budgets (``AgentRecipeConfig``)
plus the credit-assignment arms, the horizon curriculum and the long-suite measurements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longmoe.pipelines.agent.config import AgentRecipeConfig

ARMS = {  # name -> RLConfig fields changed from the agent recipe's RL run (GiGPO, KL 0.02)
    "outcome": {"step_adv_weight": 0.0},  # (a) outcome-only group advantages (GRPO-style)
    "gigpo": {},  # (b) episode + step-wise advantages (GiGPO, omega = 1)
    "gigpo_nokl": {"kl_coef": 0.0},  # (c) (b) without the KL term
}
CURRICULUM = "gigpo_curriculum"  # (b) trained on short horizons first, then the targets: same steps


@dataclass
class AgentLongConfig(AgentRecipeConfig):
    """Budgets for the full run: 3 arms x 3 seeds (+ 3 curriculum runs) of ``rl["steps"]`` RL steps
    at horizons 8 and 16 on the calculator: about 12 CPU hours on this 2-core machine (estimate from
    the agent recipe's 22 min per 60-step run at horizons 2-4, scaled by episode length, x4);
    ``quick()`` runs every stage at smoke-test size in minutes."""

    run_dir: str = "runs/agent-long"
    sft_horizons: list[int] = field(default_factory=lambda: [2, 4, 8])
    rl: dict[str, Any] = field(
        default_factory=lambda: {
            "steps": 60, "tasks_per_step": 8, "group_size": 8, "horizons": [8, 16], "lr": 5e-5,
            "kl_coef": 0.02, "max_turn_tokens": 40, "max_episode_tokens": 2048, "micro_batch": 8,
            "minibatches": 2, "ckpt_every": 10,
        }
    )  # fmt: skip
    ablations: list[str] = field(default_factory=list)  # the arms replace the agent recipe's ablations
    eval_horizons: list[int] = field(default_factory=lambda: [8, 16])
    arms: list[str] = field(default_factory=lambda: list(ARMS))
    curriculum: bool = True  # also run CURRICULUM: the same steps, the first half at curriculum_horizons
    curriculum_horizons: list[int] = field(default_factory=lambda: [2, 4])
    expert_episodes: int = 20  # per (env, horizon) of the long suite, for the trajectory-length plot
    bench: bool = True  # run bench/rollout_long.py (horizon 32; a source checkout only)

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = sorted(set(self.arms) - set(ARMS))
        if bad or not self.arms:
            raise ValueError(f"arms: {self.arms} is invalid: expected some of {sorted(ARMS)}")
        if self.expert_episodes < 1:
            raise ValueError(
                f"expert_episodes={self.expert_episodes} is invalid: expected a positive integer"
            )

    @classmethod
    def quick(cls, run_dir: str = "runs/agent-long-quick") -> AgentLongConfig:  # type: ignore[override]
        rl = {**cls().rl, "steps": 2, "tasks_per_step": 2, "group_size": 4, "ckpt_every": 1,
              "max_episode_tokens": 1024}  # fmt: skip
        return cls(
            run_dir=run_dir, pretrain_tokens=8_000, sft_steps=4, sft_batch=2, rl=rl, eval_horizons=[8],
            eval_episodes=4, rl_lrs=[5e-5], rl_seeds=1, val_episodes=2, expert_episodes=2,
        )  # fmt: skip
