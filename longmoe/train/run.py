"""The run directory's decisions, in one place: resume or start, whose configs win, whether they fit.

- ``is_resumed``: a run resumes when asked to and its marker file (``config.json``, ``sft_config.json``,
  ``rl_config.json``) is there; every trainer and command asks this function, nothing else.
- ``check_resumable``: what ``--resume`` refuses (no run, not a run, a given config that differs from the
  run's: the one-line error naming the differing fields), before anything is loaded.
- ``open_run``: the model config, train config and tokenizer a trainer uses: the run's own files on a
  resume (a resume never changes a run), else the caller's; the memory check and the vocabulary check
  run here, once, before a tokenizer is trained.
- ``check_checkpoint_config``: a checkpoint copied in from another run is refused.
- ``pin_config``: a loop started by code (distillation, a recipe's cell) writes its config into its run
  directory once and refuses another on a later start (``check_same_config``: the same one-line error).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longmoe import checkpoint as ckpt
from longmoe.config import IMAGE_PATCH_TOKEN_ID, ConfigError, ModelConfig
from longmoe.data.corpus import corpus_texts
from longmoe.data.tokenizer import Tokenizer
from longmoe.errors import UserError
from longmoe.memory import check_memory
from longmoe.train.config import TrainConfig

TokenizerSource = Tokenizer | Callable[[], Tokenizer] | None  # a tokenizer, or how to make one


def config_differences(a: dict[str, Any], b: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fields whose values differ between two config dicts (nested ones too)."""
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}")
    return out


def is_resumed(run_dir: str | Path, resume: bool, marker: str = ckpt.CONFIG_FILE) -> bool:
    """True when this start continues an existing run (asked to, and the run's ``marker`` exists)."""
    return resume and (Path(run_dir) / marker).is_file()


def check_resumable(
    run_dir: Path, marker: str = ckpt.CONFIG_FILE, given: ModelConfig | None = None, what: str = ""
) -> None:
    """``--resume`` needs an existing run, and a model config given with it (``what``: the flag, for the
    message) must be the run's."""
    if not run_dir.is_dir():
        raise UserError(f"--resume: run directory {run_dir} does not exist (drop --resume to start a run)")
    if not (run_dir / marker).is_file():
        raise UserError(f"--resume: {run_dir} is not a training run (no {marker})")
    if given is not None:
        run_cfg = run_dir / ckpt.CONFIG_FILE
        check_same_config(run_cfg, ModelConfig.load(run_cfg).to_dict(), given.to_dict(), f"--resume: {what}")


def check_same_config(
    run_file: Path, saved: dict[str, Any], given: dict[str, Any], what: str,
    fix: str = "drop the flag or use another --run-dir",
) -> None:  # fmt: skip
    """The one-line refusal of a config (``what``) that differs from the one a run was started with
    (``saved``, read from ``run_file``), naming the differing fields and how to go on (``fix``)."""
    diff = config_differences(saved, given)
    if diff:
        raise UserError(
            f"{what} differs from the run's {run_file} in {', '.join(diff)} "
            f"(a resumed run keeps its own config; {fix})"
        )


def pin_config(run_file: Path, given: dict[str, Any], what: str) -> bool:
    """A run directory's config for a loop started by code rather than a command (distillation, a
    recipe's cell): a new run writes ``given`` to ``run_file``; a run that exists refuses any other
    (``check_same_config``). True when the run existed."""
    given = json.loads(json.dumps(given))  # as it reads back (tuples are lists)
    if run_file.is_file():
        saved = json.loads(run_file.read_text())
        check_same_config(run_file, saved, given, what, "use another run directory")
        return True
    run_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_file.with_name(f".tmp-{run_file.name}")
    tmp.write_text(json.dumps(given, indent=2, sort_keys=True) + "\n")
    tmp.replace(run_file)
    return False


def check_checkpoint_config(path: Path, cfg: ModelConfig, run_dir: Path) -> None:
    """A checkpoint copied in from another run would fail to load (or load into the wrong model)."""
    theirs = json.loads((path / ckpt.CONFIG_FILE).read_text())
    diff = config_differences(cfg.to_dict(), theirs)
    if diff:
        raise ckpt.CheckpointError(
            f"checkpoint {path} comes from another config: its {ckpt.CONFIG_FILE} differs from "
            f"{run_dir / ckpt.CONFIG_FILE} in {', '.join(diff)}"
        )


def train_tokenizer(
    vocab_size: int, data: str | Path | None = None, max_chars: int = 20_000_000
) -> Tokenizer:
    """Byte-level BPE on the train split of the corpus (the first ``max_chars`` characters of it)."""
    return Tokenizer.train(corpus_texts(data, "train", max_chars), vocab_size=vocab_size)


def check_fits(cfg: ModelConfig, tok: Tokenizer) -> None:
    if tok.vocab_size > cfg.vocab_size:
        raise ConfigError(
            f"vocab_size={cfg.vocab_size} is too small for the tokenizer: it has {tok.vocab_size} tokens; "
            f"expected vocab_size >= {tok.vocab_size}"
        )
    if cfg.vision is not None and tok.image_patch_id != IMAGE_PATCH_TOKEN_ID:
        raise ConfigError(
            f"the tokenizer's <|image_patch|> has id {tok.image_patch_id}, but a vision model finds image "
            f"positions by id {IMAGE_PATCH_TOKEN_ID}: use a tokenizer trained by longmoe"
        )


@dataclass
class RunFiles:
    """What a trainer runs with, and whether it came from an existing run."""

    model_cfg: ModelConfig
    train_cfg: TrainConfig
    tokenizer: Tokenizer
    existing: bool

    def write(self, run_dir: Path) -> None:
        """A new run's files (the caller writes them once, on rank 0)."""
        self.model_cfg.save(run_dir / ckpt.CONFIG_FILE)
        self.train_cfg.save(run_dir / ckpt.TRAIN_CONFIG)
        self.tokenizer.save(run_dir / ckpt.TOKENIZER_FILE)


def open_run(
    run_dir: Path,
    resume: bool,
    model_cfg: ModelConfig | None,
    train_cfg: TrainConfig | None,
    tokenizer: TokenizerSource,
) -> RunFiles:
    """The configs and tokenizer of a resumed run (its own files win over the caller's) or a new one."""
    existing = is_resumed(run_dir, resume)
    if existing:
        model_cfg = ModelConfig.load(run_dir / ckpt.CONFIG_FILE)
        train_cfg = TrainConfig.load(run_dir / ckpt.TRAIN_CONFIG)
        tokenizer = Tokenizer.from_file(run_dir / ckpt.TOKENIZER_FILE)
    if model_cfg is None or train_cfg is None or tokenizer is None:
        raise ValueError(f"run {run_dir}: a new run needs a model config, train config, tokenizer")
    check_memory(model_cfg)  # before minutes of tokenizer training, not after
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else tokenizer()
    check_fits(model_cfg, tok)
    return RunFiles(model_cfg, train_cfg, tok, existing)
