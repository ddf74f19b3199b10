"""The RL trainer: rollouts through the engine, group-relative + step-wise advantages, clipped updates.

One RL step:

1. **rollouts**: ``tasks_per_step`` task seeds (a pure function of ``seed`` and the step), each
   played ``group_size`` times by the current policy through the serving engine
   (``agent.rollout.collect``: sessions keep every episode's cache across turns). The engine
   serves the policy module itself, so it always samples from the current weights; its prefix
   snapshots are cleared after every update;
2. **advantages** per group (``rl.advantage``): episode-level group-relative plus ``ω`` times the
   step-wise advantage of turns taken from the same environment state;
3. **update**: the reference's log-probs of the sampled tokens (one no-grad forward of the frozen
   starting model; the KL is logged even when ``kl_coef`` is 0), then ``ppo_epochs`` passes of
   ``minibatches`` optimizer steps over the rollouts, each accumulating micro-batches of
   ``micro_batch`` trajectories, on the clipped loss with the k3 KL (``rl.loss``), normalised over
   all policy tokens of the minibatch. With ``tis_cap`` (the default) the ratio is taken against the
   trainer's own log-probs, recomputed by the update's forward before it (so the first ratio is
   exactly 1), and each token is weighted by ``min(π_trainer / π_rollout, tis_cap)`` (TIS);
4. **metrics** (``RUN/metrics.jsonl``): reward, success, malformed and truncated shares, episode
   length, KL, clip share, grad norm, the engine/trainer log-prob mismatch (``mismatch_max``,
   ``mismatch_mean``), routing drift vs the reference on the step's policy tokens.

The run directory: ``rl_config.json``, ``tokenizer.json``, ``reference/`` (the frozen starting
weights, written once), ``metrics.jsonl``, atomic ``checkpoints/step-N/`` and ``final/``. The
checkpoints are the ``Checkpointer``'s (``train/checkpointer.py``): policy weights and balancer state,
optimizer, the (constant) LR schedule's position, RNG, step, and the reference's weight hash (a
resume against a swapped reference is refused). The PPO "old policy" needs no state of its own: its
log-probs are recomputed from the current weights at the start of every update (step 3).
``--resume`` continues
from the newest complete checkpoint and equals an uninterrupted run: task seeds and sampling seeds
are functions of the step, the minibatch order of a seeded generator.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from longmoe import checkpoint as ckpt
from longmoe.agent.rollout import RolloutConfig, Trajectory, collect
from longmoe.data.tokenizer import TOKENIZER_FILE
from longmoe.distributed.parallel_dims import ParallelDims
from longmoe.envs import Env, make_env
from longmoe.envs.seeds import train_task_seed
from longmoe.model import WEIGHTS_FILE, LongMoE
from longmoe.rl.advantage import turn_advantages
from longmoe.rl.config import REFERENCE_DIR, RL_CONFIG, RLConfig
from longmoe.rl.loss import policy_loss, tis_weights
from longmoe.runlog import append_metrics, truncate_metrics
from longmoe.serve.engine import Engine
from longmoe.train.checkpointer import RNG, Checkpointer, Progress
from longmoe.train.drift import freeze_routing, measure_drift
from longmoe.train.optim import LRSchedule, ScheduleConfig, build_optimizer
from longmoe.train.parallel import SingleProcess
from longmoe.train.rng import seed_everything
from longmoe.train.run import is_resumed

log = logging.getLogger(__name__)

EnvFactory = Callable[[int], Env]  # horizon -> a fresh environment
RL_BETAS = (0.9, 0.999)  # torch's AdamW defaults, which RL has always used
NO_SIGNAL_KL = 1e-6  # mean k3 below which a minibatch without advantages has nothing to learn


def task_seeds(seed: int, step: int, n: int) -> list[int]:
    """The training task seeds of one step (below ``HELD_OUT_SEED_BASE``: never an evaluation task)."""
    rng = random.Random(f"longmoe-rl:{seed}:{step}")
    return [train_task_seed(rng) for _ in range(n)]


def token_tensors(
    trajs: Sequence[Trajectory], advs: Sequence[Sequence[float]] | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids [B, T]`` and, per predicted position ``[B, T-1]``: ``mask`` (policy
    tokens), ``old_logp`` (rollout log-probs) and ``adv`` (the token's turn advantage)."""
    T = max(len(t.ids) for t in trajs)
    B = len(trajs)
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T - 1, dtype=torch.bool)
    old = torch.zeros(B, T - 1)
    adv = torch.zeros(B, T - 1)
    for b, t in enumerate(trajs):
        n = len(t.ids)
        ids[b, :n] = torch.tensor(t.ids)
        mask[b, : n - 1] = torch.tensor(t.policy_mask[1:])
        old[b, : n - 1] = torch.tensor(t.logprobs[1:])
        if advs is not None:
            for u, a in zip(t.turns, advs[b], strict=True):
                adv[b, u.start - 1 : u.end - 1] = a  # position j predicts token j + 1
    return {"input_ids": ids, "mask": mask, "old_logp": old, "adv": adv}


def token_logprobs(model: LongMoE, ids: torch.Tensor) -> torch.Tensor:
    """``log p(ids[:, j+1] | ids[:, :j+1])`` for every position: ``[B, T-1]`` (fp32)."""
    logits = model(ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]


def mismatch(micro: Sequence[dict[str, torch.Tensor]], trainer: Sequence[torch.Tensor]) -> dict[str, float]:
    """``mismatch_max`` / ``mismatch_mean``: |trainer − rollout| log-prob over the policy tokens."""
    d = torch.cat([(t - m["old_logp"])[m["mask"]].abs() for m, t in zip(micro, trainer, strict=True)])
    if not d.numel():
        return {"mismatch_max": 0.0, "mismatch_mean": 0.0}
    return {"mismatch_max": float(d.max()), "mismatch_mean": float(d.mean())}


def rollout_summary(trajs: Sequence[Trajectory]) -> dict[str, float]:
    n = max(1, len(trajs))
    return {
        "reward": sum(t.reward for t in trajs) / n,
        "success": sum(t.success for t in trajs) / n,
        "malformed": sum(t.malformed for t in trajs) / n,
        "truncated": sum(t.truncated for t in trajs) / n,
        "turns": sum(len(t.turns) for t in trajs) / n,
        "episode_tokens": sum(len(t.ids) for t in trajs) / n,
        "policy_tokens": sum(t.policy_tokens for t in trajs) / n,
    }


class ReferenceFingerprint:
    """A checkpoint part: the hash of the frozen reference's weights (``RUN/reference/``, written once),
    so a run whose reference was swapped is refused instead of measuring KL to another model."""

    def __init__(self, ref_dir: Path) -> None:
        self.path = ref_dir / WEIGHTS_FILE
        self.digest = ckpt.sha256_file(self.path)

    def state_dict(self) -> dict[str, Any]:
        return {"sha256": self.digest}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["sha256"] != self.digest:
            raise ckpt.CheckpointError(
                f"{self.path} is not the reference this run's checkpoints were trained against "
                "(its hash differs): restore the run's reference/ or start a new run"
            )


class RLTrainer:
    """Builds (or resumes) an RL run and trains it; ``fit()`` runs to ``steps``."""

    def __init__(
        self,
        run_dir: str | Path,
        cfg: RLConfig | None = None,
        resume: bool = False,
        max_steps: int | None = None,
        env_factory: EnvFactory | None = None,
    ) -> None:
        """``max_steps``: stop (with a checkpoint) after that many steps in total; ``env_factory``:
        build environments by horizon instead of ``make_env(cfg.env, ...)`` (tests)."""
        self.run_dir = Path(run_dir)
        self.max_steps = max_steps
        if is_resumed(self.run_dir, resume, RL_CONFIG):
            cfg = RLConfig.load(self.run_dir / RL_CONFIG)  # a resume never changes the run
        if cfg is None:
            raise ValueError(f"run {self.run_dir}: a new RL run needs an RLConfig")
        self.cfg = cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ref_dir = self.run_dir / REFERENCE_DIR
        if not ref_dir.exists():
            if not cfg.init:
                raise ValueError("init: expected the model directory or run to start RL from")
            model, tok, _ = ckpt.load_model(cfg.init)
            ckpt.save_model_dir(ref_dir, model, tok)
            cfg.save(self.run_dir / RL_CONFIG)
            tok.save(self.run_dir / TOKENIZER_FILE)
        seed_everything(cfg.seed)
        self.policy, self.tok, _ = ckpt.load_model(ref_dir)
        self.reference = ckpt.load_model(ref_dir).model.eval().requires_grad_(False)
        if cfg.freeze_router:  # before the optimizer: frozen routers are not in its groups
            freeze_routing(self.policy)
        self.opt = build_optimizer(self.policy, cfg.lr, cfg.weight_decay, betas=RL_BETAS)
        self.schedule = LRSchedule(self.opt, ScheduleConfig(lr=cfg.lr, schedule="constant"), cfg.steps)
        self.counters = Progress()
        self.checkpointer = Checkpointer(
            self.run_dir, self.policy, self.opt, SingleProcess(ParallelDims(), torch.device("cpu")),
            self.policy.cfg, self.run_dir / TOKENIZER_FILE, self.counters,
            {"schedule": self.schedule, "rng": RNG(), "reference": ReferenceFingerprint(ref_dir)},
            cfg.keep_last,
        )  # fmt: skip
        if resume:
            self.checkpointer.restore()
        truncate_metrics(self.run_dir, self.step)  # a resumed log reads as one uninterrupted run
        self.env_factory = env_factory or (lambda h: make_env(cfg.env, horizon=h, **cfg.env_args))
        self.engine = Engine(self.policy, self.tok, cfg.engine_config())  # serves the policy module itself

    @property
    def step(self) -> int:
        return self.counters.step

    # ------------------------------------------------------------------ run files
    def log(self, rec: dict[str, Any]) -> None:
        append_metrics(self.run_dir, rec)

    def save(self) -> Path:
        return self.checkpointer.save()

    def close(self) -> None:
        self.engine.close()

    # ------------------------------------------------------------------ one step
    def rollouts(self) -> list[Trajectory]:
        """The step's groups, played by the current policy (see the module docstring)."""
        cfg = self.cfg
        seeds = task_seeds(cfg.seed, self.step, cfg.tasks_per_step)
        horizons = [
            cfg.horizons[(self.step * cfg.tasks_per_step + i) % len(cfg.horizons)] for i in range(len(seeds))
        ]
        rcfg = RolloutConfig(
            group_size=cfg.group_size,
            max_turn_tokens=cfg.max_turn_tokens,
            max_episode_tokens=cfg.max_episode_tokens,
            temperature=cfg.temperature,
            seed=cfg.seed * 1_000_003 + self.step,
        )
        self.policy.eval()
        return collect(self.engine, lambda i: self.env_factory(horizons[i]), seeds, rcfg)

    def advantages(self, trajs: Sequence[Trajectory]) -> list[list[float]]:
        """Per trajectory, per turn: the advantage within its task's group."""
        cfg = self.cfg
        out: list[list[float]] = [[] for _ in trajs]
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(trajs):
            groups.setdefault(t.task, []).append(i)
        for members in groups.values():
            keys = [[u.state_key for u in trajs[i].turns] for i in members]
            rewards = [trajs[i].reward for i in members]
            advs = turn_advantages(keys, rewards, cfg.step_adv_weight, cfg.gamma, cfg.adv_std_norm)
            for i, a in zip(members, advs, strict=True):
                out[i] = a
        return out

    def update(self, trajs: Sequence[Trajectory], advs: Sequence[Sequence[float]]) -> dict[str, float]:
        """The policy update on one step's rollouts; returns the mean loss parts and grad norm."""
        cfg = self.cfg
        keep = [i for i, t in enumerate(trajs) if t.policy_tokens]  # not an episode cut before a turn
        trajs, advs = [trajs[i] for i in keep], [advs[i] for i in keep]
        if not trajs:
            return {}
        mb = cfg.micro_batch
        micro = [token_tensors(trajs[i : i + mb], advs[i : i + mb]) for i in range(0, len(trajs), mb)]
        with torch.no_grad():
            ref = [token_logprobs(self.reference, m["input_ids"]) for m in micro]
        old = self.trainer_logprobs(micro)
        out = mismatch(micro, old)
        tis: list[torch.Tensor | None] = [None] * len(micro)
        if cfg.tis_cap is not None:  # PPO against the trainer's own log-probs, TIS against the engine's
            tis = [tis_weights(o, m["old_logp"], cfg.tis_cap) for o, m in zip(old, micro, strict=True)]
            capped = sum(
                float(((w >= cfg.tis_cap) & m["mask"]).sum()) for w, m in zip(tis, micro, strict=True)
            )
            out["tis_capped"] = capped / max(1.0, float(sum(m["mask"].sum() for m in micro)))
            for m, o in zip(micro, old, strict=True):
                m["old_logp"] = o
        gen = torch.Generator().manual_seed(cfg.seed * 7_919 + self.step)
        sums: dict[str, float] = {
            "loss": 0.0,
            "pg": 0.0,
            "kl": 0.0,
            "clip_frac": 0.0,
            "ratio": 0.0,
            "tis": 0.0,
        }
        n_opt, norms, skipped = 0, [], 0
        self.policy.train()
        for _ in range(cfg.ppo_epochs):
            order = torch.randperm(len(micro), generator=gen).tolist()
            for part in (order[j :: cfg.minibatches] for j in range(cfg.minibatches)):
                if not part:
                    continue
                if cfg.loss_norm == "token":
                    total = float(sum(micro[k]["mask"].sum() for k in part))
                else:
                    total = float(sum((micro[k]["mask"].sum(1) > 0).sum() for k in part))
                self.schedule.apply()
                self.opt.zero_grad(set_to_none=True)
                mb_kl = 0.0
                for k in part:
                    m = micro[k]
                    logp = token_logprobs(self.policy, m["input_ids"])
                    lp = policy_loss(
                        logp, m["old_logp"], ref[k], m["adv"], m["mask"],
                        cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.loss_norm, tis[k],
                    )  # fmt: skip
                    size = m["mask"].sum() if cfg.loss_norm == "token" else (m["mask"].sum(1) > 0).sum()
                    w = float(size) / max(total, 1.0)
                    (lp.loss * w).backward()
                    sums["loss"] += float(lp.loss.detach()) * w
                    for key in ("pg", "kl", "clip_frac", "ratio", "tis"):
                        sums[key] += getattr(lp, key) * w
                    mb_kl += lp.kl * w
                clip = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
                norms.append(float(torch.nn.utils.clip_grad_norm_(self.policy.parameters(), clip)))
                # No signal: every advantage is 0 (all rewards of every group equal) and the policy is
                # the reference (or KL is off). The gradient is then rounding noise (train- vs
                # eval-mode arithmetic), which Adam would turn into a full-size step (m / (√v + ε)).
                signal = any(bool(micro[k]["adv"][micro[k]["mask"]].any()) for k in part)
                # A skipped minibatch leaves the balancing bias alone too: moving it would change the
                # routing (so the policy) with no signal, and the next minibatch would see a KL spike.
                stepped = signal or (cfg.kl_coef > 0 and mb_kl > NO_SIGNAL_KL)
                if stepped:
                    self.opt.step()
                else:
                    skipped += 1
                for layer in self.policy.moe_layers():
                    if stepped:
                        layer.update_balance()
                    else:
                        layer.discard_step_counts()
                n_opt += 1
        self.policy.eval()
        self.engine.weights_changed()  # prefix snapshots hold the old weights' states
        out.update({k: v / max(n_opt, 1) for k, v in sums.items()})
        out["grad_norm"] = sum(norms) / max(len(norms), 1)
        out["skipped_updates"] = skipped
        return out

    def trainer_logprobs(self, micro: Sequence[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
        """The policy's log-probs of the rollouts before the update, by the very forward the update
        runs (train mode, grad enabled, the same micro-batches), so the first minibatch's PPO ratio is
        exactly 1; the pass's balancer counts are discarded (it is not an optimizer step)."""
        self.policy.train()
        out = [token_logprobs(self.policy, m["input_ids"]).detach() for m in micro]
        for layer in self.policy.moe_layers():
            layer.discard_step_counts()
        return out

    def drift(self, trajs: Sequence[Trajectory]) -> dict[str, Any]:
        """Routing drift of the policy from the reference on the policy tokens of a few trajectories."""
        sample = [t for t in trajs if t.policy_tokens][: self.cfg.drift_trajectories]
        if not sample or not self.policy.moe_layers():
            return {}
        m = token_tensors(sample)
        mask = torch.cat([m["mask"], torch.zeros(len(sample), 1, dtype=torch.bool)], 1)  # per input token
        return measure_drift(self.policy, self.reference, m["input_ids"], mask).record()

    def train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        trajs = self.rollouts()
        t1 = time.perf_counter()
        advs = self.advantages(trajs)
        parts = self.update(trajs, advs)
        t2 = time.perf_counter()
        self.schedule.advance()
        self.counters.step += 1
        n_tok = sum(len(t.ids) for t in trajs)
        rec: dict[str, Any] = {"step": self.step, **rollout_summary(trajs), **parts}
        rec["adv_abs"] = sum(abs(a) for ad in advs for a in ad) / max(1, sum(len(a) for a in advs))
        every = self.cfg.drift_every
        if every and self.step % every == 0:
            rec.update(self.drift(trajs))
        rec.update(rollout_s=round(t1 - t0, 3), update_s=round(t2 - t1, 3))
        rec["rollout_tok_s"] = round(n_tok / max(t1 - t0, 1e-9), 1)
        return rec

    def fit(self) -> dict[str, Any]:
        """Train to ``cfg.steps`` (or ``max_steps``); checkpoints as configured; ``final/`` at the end."""
        cfg, last = self.cfg, {}
        end = cfg.steps if self.max_steps is None else min(cfg.steps, self.max_steps)
        try:
            while self.step < end:
                last = self.train_step()
                self.log(last)
                log.info("rl step %d: reward %.3f kl %.4f", self.step, last["reward"], last.get("kl", 0.0))
                if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and self.step < end:
                    self.save()
            self.save()
            if self.step >= cfg.steps:
                ckpt.save_model_dir(self.run_dir / ckpt.FINAL_DIR, self.policy, self.tok)
        finally:
            self.close()
        return last
