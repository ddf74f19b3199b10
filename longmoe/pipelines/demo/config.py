"""What the demo runs: output directory, budget scale, seed, resume."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SAMPLE_PROMPT = "import os\n\n\ndef "


@dataclass(frozen=True)
class DemoConfig:
    """``scale`` multiplies the tiny curriculum's token budgets (0.02 is a smoke test); ``synthetic``
    mixes synthetic long-context task documents into the long stages; ``recall`` adds the MQAR part
    (``recall.py``)."""

    run_dir: Path = Path("runs/demo")
    scale: float = 1.0
    seed: int = 0
    resume: bool = False
    progress: bool = True
    synthetic: bool = True
    ckpt_every: int = 50
    val_windows: int = 4
    sample_prompt: str = SAMPLE_PROMPT
    sample_tokens: int = 96
    recall: bool = True  # train a small hybrid on MQAR and report its recall at 1x/4x/16x its length
    recall_pairs: int = 8
    recall_steps: int = 400  # at most (early stop at 0.99); scaled down with scale < 1
    recall_eval_n: int = 64  # held-out rows per length

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale={self.scale} is invalid: expected a number > 0")
        if self.recall_pairs < 1 or self.recall_steps < 1 or self.recall_eval_n < 1:
            raise ValueError(
                f"recall_pairs={self.recall_pairs}, recall_steps={self.recall_steps}, "
                f"recall_eval_n={self.recall_eval_n}: expected integers >= 1"
            )
        if self.ckpt_every < 0 or self.val_windows < 1 or self.sample_tokens < 1:
            raise ValueError(
                f"ckpt_every={self.ckpt_every}, val_windows={self.val_windows}, "
                f"sample_tokens={self.sample_tokens}: expected ckpt_every >= 0, the others >= 1"
            )
