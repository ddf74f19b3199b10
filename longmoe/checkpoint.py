"""The run directory: its layout, atomic checkpoints, and the one model loader.

Every stage (train, serve, eval, pipelines) reads and writes runs through this module, so the
layout is named once, here::

    RUN/config.json  train_config.json  tokenizer.json   what the run was started with (reused on resume)
    RUN/metrics.jsonl                                   one JSON object per logged step / evaluation
    RUN/checkpoints/step-XXXXXXXX/                      atomic checkpoints (below)
    RUN/final/                                          the last weights as a plain model directory

A model directory holds ``config.json``, ``model.safetensors`` and ``tokenizer.json``.
``load_model(path)`` accepts a model directory or a run (``resolve_model_dir``) and returns the
model, its tokenizer and ``ModelMeta`` (where it came from, its config, the training window).

A checkpoint is a directory ``RUN/checkpoints/step-00000123/`` holding a loadable model directory
(``config.json``, ``model.safetensors``, ``tokenizer.json``; no tokenizer for a model that reads token
ids, e.g. the MQAR recipe's) plus ``trainer_state.pt`` (optimizer,
schedule position, RNG, data position, curriculum stage, metrics; tensors and plain containers only,
read back with ``weights_only=True``) and, written last, ``COMPLETE``: a JSON manifest with the
SHA-256 of every file. The directory is assembled under a temporary name and renamed in one
``os.replace``, so a process killed mid-save leaves either the previous checkpoints untouched or a
``.tmp-*`` directory that is ignored and cleaned up. A checkpoint whose manifest or hashes do not
match is treated as corrupt: loading falls back to the previous complete one.

A run trained on several processes writes *sharded* checkpoints instead of ``model.safetensors`` and
the optimizer: ``dcp/`` holds every rank's shards (``longmoe.distributed.checkpoint``), and the same
temporary-directory / manifest / rename protocol (``finalize``, run by rank 0 once all ranks wrote)
makes them just as atomic. The manifest lists the files below ``dcp/`` by relative path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors.torch import load_file

from longmoe.config import ModelConfig
from longmoe.data.tokenizer import TOKENIZER_FILE, Tokenizer
from longmoe.errors import UserError
from longmoe.model import CONFIG_FILE, WEIGHTS_FILE, LongMoE

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- the run layout
FINAL_DIR = "final"  # RUN/final: the finished model directory
CKPT_DIR = "checkpoints"  # RUN/checkpoints/step-XXXXXXXX
STEP_PREFIX = "step-"
TRAIN_CONFIG = "train_config.json"  # RUN/train_config.json: the TrainConfig the run started with
METRICS = "metrics.jsonl"  # RUN/metrics.jsonl: the training log
MANIFEST = "COMPLETE"
STATE_FILE = "trainer_state.pt"
MODEL_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE)  # a model directory
CKPT_MODEL_FILES = MODEL_FILES[:2]  # a checkpoint's model (+ the tokenizer when the run has one)
SHARDED_DIR = "dcp"  # a sharded checkpoint's DCP directory (model + optimizer shards, ``.metadata``)
SHARDED_FILES = (CONFIG_FILE, TOKENIZER_FILE, f"{SHARDED_DIR}/.metadata")
# Fault injection for the crash-safety test: ``LONGMOE_FAULT=kill-in-save:STEP`` SIGKILLs the process
# after checkpoint STEP's files are written but before its manifest and rename.
FAULT_ENV = "LONGMOE_FAULT"


class CheckpointError(UserError, RuntimeError):
    """A checkpoint (or every checkpoint of a run) is missing or unreadable."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(path: Path) -> None:
    for f in path.iterdir():
        if f.is_dir():
            _fsync_tree(f)
            continue
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(path)


def _files(path: Path) -> list[Path]:
    """Every file below ``path`` (sub-directories included), in a stable order."""
    return sorted(f for f in path.rglob("*") if f.is_file())


def step_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CKPT_DIR / f"{STEP_PREFIX}{step:08d}"


def tmp_dir(run_dir: str | Path, step: int, tag: str | int | None = None) -> Path:
    """Where checkpoint ``step`` is assembled (``tag``: this process's id by default; the sharded
    save passes a name every rank agrees on)."""
    name = f".tmp-{STEP_PREFIX}{step:08d}-{os.getpid() if tag is None else tag}"
    return Path(run_dir) / CKPT_DIR / name


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: LongMoE,
    tokenizer_file: str | Path | None,
    state: dict[str, Any],
    keep_last: int = 3,
) -> Path:
    """Write checkpoint ``step`` atomically and keep only the newest ``keep_last`` complete ones
    (``tokenizer_file`` None: a model that reads token ids, e.g. a synthetic-task recipe's)."""
    tmp = tmp_dir(run_dir, step)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, tmp / TOKENIZER_FILE)
    torch.save(state, tmp / STATE_FILE)
    return finalize(tmp, run_dir, step, keep_last)


def finalize(tmp: Path, run_dir: str | Path, step: int, keep_last: int) -> Path:
    """Seal the assembled ``tmp``: manifest of hashes, fsync, one rename to ``step-XXXXXXXX``, prune."""
    if os.environ.get(FAULT_ENV) == f"kill-in-save:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    files = {str(f.relative_to(tmp)): sha256_file(f) for f in _files(tmp)}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1) + "\n")
    _fsync_tree(tmp)
    final = step_dir(run_dir, step)
    if final.exists():  # re-saving a step (e.g. after a resume): replace it
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    prune(run_dir, keep_last)
    return final


def is_complete(path: Path, verify_hashes: bool = True) -> bool:
    """True when ``path`` has a manifest and every listed file exists with the recorded hash."""
    man = path / MANIFEST
    try:
        files = json.loads(man.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for name, digest in files.items():
        f = path / name
        if not f.is_file() or (verify_hashes and sha256_file(f) != digest):
            return False
    return STATE_FILE in files and (
        all(n in files for n in CKPT_MODEL_FILES) or all(n in files for n in SHARDED_FILES)
    )


def is_sharded(path: Path) -> bool:
    """True for a checkpoint written by several processes (``dcp/`` instead of ``model.safetensors``)."""
    return (path / SHARDED_FILES[-1]).is_file()


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Checkpoint directories of a run (complete or not), oldest first; temporary ones excluded."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(STEP_PREFIX) and p.name[len(STEP_PREFIX) :].isdigit():
            out.append(p)
    return sorted(out, key=lambda p: int(p.name[len(STEP_PREFIX) :]))


def prune(run_dir: str | Path, keep_last: int) -> None:
    """Delete stale temporaries and all but the newest ``keep_last`` complete checkpoints."""
    root = Path(run_dir) / CKPT_DIR
    for p in root.glob(f".tmp-{STEP_PREFIX}*"):
        if not p.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(p, ignore_errors=True)
    complete = [p for p in list_checkpoints(run_dir) if is_complete(p, verify_hashes=False)]
    for p in complete[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(p, ignore_errors=True)


def load_latest(run_dir: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that verifies and loads: ``(dir, trainer_state)``; None if there is none.

    Corrupt or half-written checkpoints are skipped with a warning (falling back to older ones).
    """
    for p in reversed(list_checkpoints(run_dir)):
        if not is_complete(p):
            log.warning("checkpoint %s is incomplete or corrupt (manifest/hash mismatch); skipping it", p)
            continue
        try:
            state = torch.load(p / STATE_FILE, map_location="cpu", weights_only=True)
        except Exception as e:  # unreadable despite matching hashes: treat as corrupt
            log.warning("checkpoint %s: %s is unreadable (%s); skipping it", p, STATE_FILE, e)
            continue
        return p, state
    return None


def is_model_dir(path: Path) -> bool:
    return path.is_dir() and all((path / f).is_file() for f in MODEL_FILES)


def resolve_model_dir(path: str | Path) -> Path:
    """A model directory from ``path``: the path itself, else ``RUN/final``, else the newest complete
    checkpoint of the run. Raises ``FileNotFoundError`` saying what was looked for."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"model path not found: {p}")
    if is_model_dir(p):
        return p
    if is_model_dir(p / FINAL_DIR):
        return p / FINAL_DIR
    for c in reversed(list_checkpoints(p)):
        if is_complete(c, verify_hashes=False) and is_model_dir(c):  # sharded ones are not
            return c
    if all((p / f).is_file() for f in CKPT_MODEL_FILES):  # config + weights, no tokenizer.json
        raise FileNotFoundError(
            f"{p} has {MODEL_FILES[0]} and {MODEL_FILES[1]} but no {MODEL_FILES[2]}: a weights-only model "
            "directory (e.g. `longmoe convert --from-hf` of a checkpoint whose tokenizer longmoe cannot "
            "load). LongMoE.from_pretrained loads it to score token ids; to serve, chat or evaluate text, "
            f"put a longmoe {MODEL_FILES[2]} (vocabulary within the model's vocab_size) into {p}"
        )
    raise FileNotFoundError(
        f"{p} is neither a model directory ({', '.join(MODEL_FILES)}) nor a training run with "
        f"{FINAL_DIR}/ or a complete {CKPT_DIR}/{STEP_PREFIX}*/ checkpoint"
    )


# ---------------------------------------------------------------------- model directories
def save_model_dir(path: str | Path, model: LongMoE, tokenizer: Tokenizer) -> Path:
    """Write ``model`` + ``tokenizer`` as a plain model directory, atomically replacing ``path``."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save(tmp / TOKENIZER_FILE)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    return path


def first_mismatch(own: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> str | None:
    """The first tensor in which a weights file (``theirs``) and a model (``own``) disagree, in words,
    with how many more do; None when every name and shape matches."""
    found = [f"it lacks tensor {k!r}" for k in own if k not in theirs]
    found += [
        f"tensor {k!r} is {list(theirs[k].shape)} there, {list(own[k].shape)} in the model"
        for k in own
        if k in theirs and theirs[k].shape != own[k].shape
    ]
    found += [f"it has tensor {k!r}, which the model lacks" for k in theirs if k not in own]
    if not found:
        return None
    return found[0] + (f" (and {len(found) - 1} more mismatches)" if len(found) > 1 else "")


def load_weights(model: LongMoE, model_dir: str | Path) -> None:
    """Load a model (or checkpoint) directory's weights into an existing ``model`` in place (a resumed
    trainer keeps its parameters, which the optimizer holds). Weights written for another model
    config are a ``CheckpointError`` naming the file and the first tensor that differs."""
    w_file = Path(model_dir) / WEIGHTS_FILE
    try:
        sd = load_file(str(w_file))
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{w_file} is not a readable safetensors file: {e}") from e
    why = first_mismatch(model.state_dict(), sd)
    if why is not None:
        raise CheckpointError(f"{w_file} does not fit the model (weights of another model config?): {why}")
    model.load_state_dict(sd)


def training_window(model_dir: str | Path, cfg: ModelConfig) -> int:
    """The longest curriculum window of the run that produced ``model_dir`` (its ``train_config.json``
    in the directory or up to three levels above), else ``cfg.max_seq_len``."""
    d = Path(model_dir)
    for p in [d, *list(d.parents)[:3]]:
        f = p / TRAIN_CONFIG
        if f.is_file():
            stages = json.loads(f.read_text()).get("stages") or []
            wins = [int(s["window"]) for s in stages if isinstance(s, dict) and "window" in s]
            if wins:
                return max(wins)
    return int(cfg.max_seq_len)


@dataclass(frozen=True)
class ModelMeta:
    """Where a loaded model came from and what it was trained for."""

    model_dir: Path  # the resolved model directory (a run's final/ or newest complete checkpoint)
    config: ModelConfig
    training_window: int  # longest curriculum window of its run, else config.max_seq_len


class LoadedModel(NamedTuple):
    model: LongMoE  # in eval mode, on the requested device
    tokenizer: Tokenizer
    meta: ModelMeta


def load_model(path: str | Path, device: torch.device | str = "cpu") -> LoadedModel:
    """The one loader: a model directory or a training run (``resolve_model_dir``) -> model, tokenizer
    and ``ModelMeta``. Errors name the missing or mismatched piece."""
    d = resolve_model_dir(path)
    try:
        model = LongMoE.from_pretrained(d, device=device).eval()
    except ValueError as e:  # weights unreadable or of another config (config errors are UserErrors)
        if isinstance(e, UserError):
            raise
        raise CheckpointError(str(e)) from e
    tokenizer = Tokenizer.from_file(d / TOKENIZER_FILE)
    return LoadedModel(model, tokenizer, ModelMeta(d, model.cfg, training_window(d, model.cfg)))
