"""Supervised fine-tuning on expert tool-use demonstrations, with replay of pretraining text.

``longmoe sft`` starts from a pretrained run (or model directory) and trains with the pretraining
``Trainer`` (checkpoints, atomic saves, resume to the exact loss sequence, bf16, ``metrics.jsonl``,
progress bar). Only the data stream and the starting weights differ:

- each batch packs ``batch_size`` demonstrations: episodes of the environments' scripted experts
  (``envs.play``) on training seeds (below ``HELD_OUT_SEED_BASE``), rendered with
  ``data.chat.encode_chat`` and a leading ``<|bos|>`` as the server prompts, so the loss falls on the
  assistant turns only (system, user and tool-result tokens and role markers are context); a
  demonstration longer than ``max_len`` tokens is cut there;
- plus the stage's replay windows of pretraining text (``replay_fraction`` of the batch), which keep
  the language the model learnt; validation is next-token loss on pretraining text (``val_loss``).

The run is one curriculum stage named ``sft`` whose ``window`` is the replay/validation window. Every
``drift_every`` steps the routing drift from the starting model (``train/drift.py``) on a fixed probe
(held-out demonstrations and a validation window) goes into ``metrics.jsonl``; the starting model's
choices are stored once in ``RUN/drift_reference.pt``. ``TrainConfig.freeze_router`` freezes the
routers and balancing biases.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from longmoe import checkpoint as ckpt
from longmoe.config import IGNORE_INDEX, ModelConfig
from longmoe.configio import JsonConfig, check_types
from longmoe.data.batch import Batch
from longmoe.data.chat import encode_chat
from longmoe.data.packing import Window, collate
from longmoe.data.stages import CurriculumStage
from longmoe.data.tokenizer import Tokenizer
from longmoe.distributed.parallel_dims import is_rank0, launched
from longmoe.envs import ENVS, HELD_OUT_SEED_BASE, Env, Episode, env_config, make_env, play
from longmoe.envs.seeds import train_task_seed
from longmoe.errors import UserError
from longmoe.model import LongMoE
from longmoe.train.config import TrainConfig
from longmoe.train.curriculum import Curriculum, val_batches
from longmoe.train.drift import RoutingDrift, routing_choices, routing_drift
from longmoe.train.pretrain import Trainer
from longmoe.train.run import is_resumed
from longmoe.validation import check, is_positive_int

SFT_CONFIG = "sft_config.json"
DRIFT_REFERENCE = "drift_reference.pt"


@dataclass
class SFTConfig(JsonConfig):
    """What ``longmoe sft`` adds to a ``TrainConfig``: where to start, which demonstrations, drift.

    ``envs``: environment name -> sampling weight; ``horizons``: drawn uniformly per demonstration;
    ``env_options``: per environment, config fields other than ``horizon`` (``{"doclookup":
    {"page_chars": 200}}``); ``max_len``: demonstration tokens kept; ``drift_every``: steps between
    drift measurements (0: never); ``drift_probe``: held-out demonstrations in the drift probe."""

    init_from: str
    envs: dict[str, float] = field(default_factory=lambda: {"doclookup": 1.0, "calculator": 1.0})
    horizons: list[int] = field(default_factory=lambda: [1, 2, 3])
    env_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_len: int = 2048
    drift_every: int = 10
    drift_probe: int = 4

    def __post_init__(self) -> None:
        check_types(self)
        check(bool(self.init_from), "init_from", self.init_from, "a pretrained run or model directory")
        check(
            bool(self.envs) and set(self.envs) <= set(ENVS) and all(w >= 0 for w in self.envs.values())
            and sum(self.envs.values()) > 0,
            "envs", self.envs, f"a non-empty map from {sorted(ENVS)} to weights >= 0 with a positive sum",
        )  # fmt: skip
        check(
            bool(self.horizons) and all(is_positive_int(h) for h in self.horizons),
            "horizons", self.horizons, "a non-empty list of positive integers",
        )  # fmt: skip
        check(
            set(self.env_options) <= set(ENVS), "env_options", self.env_options, f"keys from {sorted(ENVS)}"
        )
        for name in self.envs:  # build each config once now, so a bad field fails before training
            for h in self.horizons:
                env_config(name, **{**self.env_options.get(name, {}), "horizon": h})
        check(is_positive_int(self.max_len), "max_len", self.max_len, "a positive integer")
        for n in ("drift_every", "drift_probe"):
            v = getattr(self, n)
            check(isinstance(v, int) and v >= 0, n, v, "a non-negative integer")


def sft_stage(
    steps: int, batch_size: int, replay_fraction: float, replay_window: int, replay_mix: dict[str, float]
) -> CurriculumStage:
    """The one stage of an SFT run: ``steps`` batches of ``batch_size`` demonstrations + replay."""
    s = CurriculumStage(
        "sft", window=replay_window, tokens=1, batch_size=batch_size, mix=dict(replay_mix),
        replay_fraction=replay_fraction, replay_window=replay_window, replay_mix=dict(replay_mix),
    )  # fmt: skip
    s.tokens = steps * s.batch_tokens  # so that s.steps == steps
    return s


def chat_window(tok: Tokenizer, messages: list[dict[str, Any]], max_len: int) -> Window:
    """One conversation as a packed window: ``<|bos|>`` + chat ids, targets only on assistant tokens."""
    ct = encode_chat(tok, messages, bos=True)
    ids, mask = ct.ids[:max_len], ct.assistant_mask[:max_len]
    labels = [t if m else IGNORE_INDEX for t, m in zip(ids[1:], mask[1:])] + [IGNORE_INDEX]
    return Window(ids, labels, [len(ids)])


class SFTData(Curriculum):
    """Batches of expert demonstrations plus replay windows; the position adds the demo counter."""

    def __init__(
        self, stages: list[CurriculumStage], tok: Tokenizer, seed: int, data: str | None, sft: SFTConfig
    ):
        super().__init__(stages, tok, seed, data)
        self.sft, self.demo_index = sft, 0
        self._envs: dict[tuple[str, int], Env] = {}

    def env(self, name: str, horizon: int) -> Env:
        key = (name, horizon)
        if key not in self._envs:
            self._envs[key] = make_env(name, **{**self.sft.env_options.get(name, {}), "horizon": horizon})
        return self._envs[key]

    def demonstration(self, index: int, held_out: bool = False) -> Episode:
        """Demonstration ``index``: its environment, horizon and task seed are a function of the index
        (training seeds, or with ``held_out`` the evaluation seeds from ``HELD_OUT_SEED_BASE``)."""
        rng = random.Random(f"longmoe-sft:{self.seed}:{int(held_out)}:{index}")
        names = sorted(self.sft.envs)
        name = rng.choices(names, weights=[self.sft.envs[n] for n in names])[0]
        horizon = rng.choice(self.sft.horizons)
        seed = HELD_OUT_SEED_BASE + index if held_out else train_task_seed(rng)
        return play(self.env(name, horizon), seed)

    def next_batch(self) -> Batch:
        if self.done:
            raise StopIteration("SFT data finished")
        s = self.stage
        windows = []
        for _ in range(s.batch_size):
            ep = self.demonstration(self.demo_index)
            windows.append(chat_window(self.tok, ep.messages, self.sft.max_len))
            self.demo_index += 1
        if s.n_replay:
            rep = self.packer(s.replay_mix, s.replay_window)
            windows += [rep.next_window(s.replay_window) for _ in range(s.n_replay)]
        batch = collate(windows).replace(
            stage=self.stage_idx, stage_name=s.name, window=s.window, n_demos=s.batch_size
        )
        self.batch_in_stage += 1
        if self.batch_in_stage >= s.steps:
            self.stage_idx, self.batch_in_stage = self.stage_idx + 1, 0
        return batch

    def probe(self) -> list[Batch]:
        """The fixed drift probe: held-out demonstrations (one packed row) and one validation window."""
        out = []
        if self.sft.drift_probe:
            demos = [self.demonstration(i, held_out=True) for i in range(self.sft.drift_probe)]
            out.append(collate([chat_window(self.tok, d.messages, self.sft.max_len) for d in demos]))
        out += val_batches(self.tok, self.stage.replay_window, 1, mix=self.stage.replay_mix, data=self.data)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "demo_index": self.demo_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.demo_index = int(state["demo_index"])


def probe_choices(model: LongMoE, probe: list[Batch]) -> list[torch.Tensor]:
    """Per MoE layer, the choices on every probe token (batches concatenated in order)."""
    per_batch = [routing_choices(model, b.input_ids, b.cu_seqlens) for b in probe]
    return [torch.cat([c[i] for c in per_batch]) for i in range(len(per_batch[0]))]


class SFTTrainer(Trainer):
    """The pretraining trainer on an ``SFTData`` stream, starting from pretrained weights."""

    def __init__(
        self,
        run_dir: str | Path,
        sft_cfg: SFTConfig | None = None,
        train_cfg: TrainConfig | None = None,
        resume: bool = False,
        progress: bool = True,
        max_steps: int | None = None,
        device: str = "cpu",
    ) -> None:
        run_dir = Path(run_dir)
        existing = is_resumed(run_dir, resume, SFT_CONFIG)
        if existing:  # the run's own files win, as for pretraining
            sft_cfg = SFTConfig.load(run_dir / SFT_CONFIG)
        if sft_cfg is None:
            raise UserError(f"{run_dir}: a new SFT run needs an SFT config (init_from, environments)")
        self.sft = sft_cfg
        model_cfg = tok = None
        if not existing:
            init_dir = ckpt.resolve_model_dir(sft_cfg.init_from)
            model_cfg = ModelConfig.load(init_dir / ckpt.CONFIG_FILE)
            tok = Tokenizer.from_file(init_dir / ckpt.TOKENIZER_FILE)
        if launched():  # before joining a group: one process, as the demonstrations are not sharded
            raise UserError("longmoe sft runs in one process (launch it without torchrun)")
        super().__init__(run_dir, model_cfg, train_cfg, tok, resume, progress, max_steps, device)
        if not existing and is_rank0():
            sft_cfg.save(run_dir / SFT_CONFIG)
        if self.step == 0:  # a new run (or one resumed before its first checkpoint): the start weights
            ckpt.load_weights(self.model, ckpt.resolve_model_dir(sft_cfg.init_from))
        self.probe = self.curriculum.probe() if sft_cfg.drift_every else []
        self.reference = self._reference_choices() if sft_cfg.drift_every else []

    def make_data(self) -> Curriculum:
        return SFTData(self.tcfg.stages, self.tok, self.tcfg.seed, self.tcfg.data, self.sft)

    def _reference_choices(self) -> list[torch.Tensor]:
        """The starting model's routing on the probe: computed at step 0, stored, read back on resume."""
        path = self.run_dir / DRIFT_REFERENCE
        if path.is_file():
            return torch.load(path, weights_only=True)["choices"]
        if self.step != 0:
            raise ckpt.CheckpointError(f"{path} is missing: the drift reference of this run is lost")
        choices = probe_choices(self.model, self.probe)
        tmp = path.with_name(f".tmp-{path.name}")
        torch.save({"choices": choices}, tmp)
        os.replace(tmp, path)
        return choices

    def drift(self) -> RoutingDrift:
        """Routing drift of the current model from the starting one, on the probe."""
        return routing_drift(probe_choices(self.model, self.probe), self.reference, self.mcfg.ffn.n_experts)

    def train_step(self) -> dict[str, Any]:
        rec = super().train_step()
        every = self.sft.drift_every
        if every and self.reference and (self.step % every == 0 or self.step == 1):
            rec.update(self.drift().record())
        return rec
