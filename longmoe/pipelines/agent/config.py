"""What the agent recipe runs: budgets of each stage, the environment, evaluation and ablations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longmoe.configio import JsonConfig, check_types

ABLATIONS = {  # name -> RLConfig fields changed from the main RL run
    "no_step_adv": {"step_adv_weight": 0.0},
    "no_kl": {"kl_coef": 0.0},
    "frozen_router": {"freeze_router": True},
}


@dataclass
class AgentRecipeConfig(JsonConfig):
    """Budgets are sized for 2 CPU cores (about 2 h 20 min with ``--jobs 2``, docs/agent.md "Results");
    ``quick()`` is a smoke test."""

    run_dir: str = "runs/agent"
    seed: int = 0
    env: str = "calculator"
    # two-digit starting stocks: the tiny model learns to copy them within the SFT budget (docs/agent.md)
    env_args: dict[str, Any] = field(default_factory=lambda: {"max_operand": 20, "max_start": 99})
    # 1. pretraining: one stage of 256-token windows of the embedded corpus
    pretrain_tokens: int = 300_000
    pretrain_batch: int = 8
    # 2. SFT on expert demonstrations
    sft_steps: int = 1500
    sft_batch: int = 8
    sft_lr: float = 2e-3
    sft_horizons: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    # 3. RL (the main run; the ablations change one field each, ABLATIONS)
    rl: dict[str, Any] = field(
        default_factory=lambda: {
            "steps": 60, "tasks_per_step": 8, "group_size": 8, "horizons": [2, 3, 4], "lr": 5e-5,
            "kl_coef": 0.02, "max_turn_tokens": 40, "max_episode_tokens": 768, "micro_batch": 16,
            "minibatches": 2, "ckpt_every": 10,
        }
    )  # fmt: skip
    ablations: list[str] = field(default_factory=lambda: list(ABLATIONS))  # each a full RL run
    # RL protocol: the lr is chosen on the validation block of task seeds (envs.seeds: never a test
    # task), from one run per candidate at the first seed; then rl_seeds runs at the chosen lr
    rl_lrs: list[float] = field(default_factory=lambda: [2e-5, 5e-5])
    rl_seeds: int = 3
    val_episodes: int = 40  # per horizon, on validation task seeds (only when rl_lrs has several)
    ablation_seeds: int = 1  # RL seeds per ablation; with fewer than 2 the report says they cannot be ranked
    # 4. held-out evaluation
    eval_horizons: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 6])
    eval_episodes: int = 120  # per horizon (x5 horizons = 600 per model)
    eval_temperature: float = 1.0
    ablation_eval_episodes: int = 60

    def __post_init__(self) -> None:
        check_types(self)
        bad = sorted(set(self.ablations) - set(ABLATIONS))
        if bad:
            raise ValueError(f"ablations: unknown {bad}; expected some of {sorted(ABLATIONS)}")
        if not self.rl_lrs or any(not lr > 0 for lr in self.rl_lrs):
            raise ValueError(f"rl_lrs={self.rl_lrs} is invalid: expected learning rates > 0")
        for name in ("rl_seeds", "val_episodes", "ablation_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is invalid: expected a positive integer")

    @classmethod
    def quick(cls, run_dir: str = "runs/agent-quick") -> AgentRecipeConfig:
        rl = {**cls().rl, "steps": 2, "tasks_per_step": 2, "group_size": 4, "ckpt_every": 1}
        return cls(
            run_dir=run_dir, pretrain_tokens=8_000, sft_steps=4, sft_batch=2, rl=rl,
            eval_horizons=[1, 2], eval_episodes=4, ablation_eval_episodes=2, rl_lrs=[5e-5], rl_seeds=1,
            val_episodes=2,
        )  # fmt: skip
