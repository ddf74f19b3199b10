"""Convert transformers ``KimiLinearForCausalLM`` checkpoints to longmoe model directories and back.

``from_hf(src, dst)``: ``src`` holds ``config.json`` and safetensors weights (one file, or shards with
``model.safetensors.index.json``) in the layout transformers saves (Moonshot's: ``q_conv1d``,
``block_sparse_moe.experts.N.w1``, ...) or its runtime layout (``conv1d``, ``mlp.experts.gate_up_proj``).
Shards are read one tensor at a time (``safe_open``); every longmoe tensor is assembled in place and
written to its offset in ``model.safetensors`` as soon as its last source piece arrives, so the peak
memory is the largest single target tensor plus the pieces of the ones still pending (one layer's
experts), never the model.

``to_hf(src, dst)``: the reverse, reading longmoe's ``model.safetensors`` tensor by tensor; a config
Kimi-Linear cannot express raises ``ConversionError`` naming the field (``kimi_config.config_to_hf``).

Tokenizer: ``tokenizer.json`` is carried over only when longmoe's ``Tokenizer`` can load it (it needs
longmoe's special tokens). Otherwise the result is a *weights-only* model directory: ``LongMoE.
from_pretrained`` loads it and it scores token ids, while serving, chat and text evaluation stop with
an error that says to add a tokenizer (``Tokenizer.from_file``). ``conversion.json`` records the
source, the direction and the tokenizer decision.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from longmoe.config import ModelConfig
from longmoe.data.tokenizer import Tokenizer
from longmoe.interop.kimi_config import HF_ARCHITECTURE, ConversionError, config_from_hf, config_to_hf
from longmoe.interop.kimi_map import Piece, canonical_pieces, source_map, target_map
from longmoe.interop.safetensors_stream import StreamingSafetensorsWriter
from longmoe.model import CONFIG_FILE, WEIGHTS_FILE, LongMoE

INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
RECORD_FILE = "conversion.json"  # what was converted from where, and what became of the tokenizer
_HF_FP32 = ("e_score_correction_bias", "gate.weight", "dt_bias")  # transformers keeps these in fp32


def _shards(src: Path) -> list[Path]:
    index = src / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [src / s for s in dict.fromkeys(weight_map.values())]
    single = src / WEIGHTS_FILE
    if single.is_file():
        return [single]
    raise FileNotFoundError(f"{src}: neither {INDEX_FILE} nor {WEIGHTS_FILE}")


def _names(files: list[Path]) -> set[str]:
    names: set[str] = set()
    for fpath in files:
        with safe_open(str(fpath), framework="pt") as fh:
            names.update(fh.keys())
    return names


def _tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``files``, one at a time: only the current one is read into memory. The file is
    reopened per tensor: ``safe_open`` maps the whole file, and the pages a long-lived mapping has
    touched stay in the process's resident set (file-backed, but counted), growing it to the file size."""
    for fpath in files:
        for name in sorted(_names([fpath])):
            with safe_open(str(fpath), framework="pt") as fh:
                yield name, fh.get_tensor(name)


def _specs(cfg: ModelConfig) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor of ``LongMoE(cfg).state_dict()``, without allocating it."""
    with torch.device("meta"):
        return {k: (v.dtype, tuple(v.shape)) for k, v in LongMoE(cfg).state_dict().items()}


def _carry_tokenizer(src: Path, dst: Path) -> str:
    tok = src / TOKENIZER_FILE
    if not tok.is_file():
        return f"none: {src} has no {TOKENIZER_FILE}; this is a weights-only model directory"
    try:
        Tokenizer.from_file(tok)
    except (ValueError, OSError, RuntimeError) as e:
        return f"none: {tok} is not a longmoe tokenizer ({e}); this is a weights-only model directory"
    shutil.copyfile(tok, dst / TOKENIZER_FILE)
    return f"copied from {tok}"


def from_hf(src: str | Path, dst: str | Path, dtype: str | None = None) -> ModelConfig:
    """Convert the transformers Kimi-Linear directory ``src`` into the longmoe model directory ``dst``.

    ``dtype``: ``"float32"`` / ``"bfloat16"`` for the longmoe model (default: bf16 if the source is).
    """
    src, dst = Path(src), Path(dst)
    if not (src / CONFIG_FILE).is_file():
        raise FileNotFoundError(
            f"{src}: no {CONFIG_FILE} (expected a transformers {HF_ARCHITECTURE} directory)"
        )
    hf = json.loads((src / CONFIG_FILE).read_text())
    files = _shards(src)
    if hf.get("tie_word_embeddings") and "lm_head.weight" in _names(files):
        hf = {**hf, "tie_word_embeddings": False}  # a stored head is used as stored (no tie in the forward)
    cfg = config_from_hf(hf, dtype=dtype)
    specs, smap = _specs(cfg), source_map(cfg)
    left: dict[str, int] = {}
    for piece, _ in smap.values():
        left[piece.target] = left.get(piece.target, 0) + 1
    dst.mkdir(parents=True, exist_ok=True)
    cfg.save(dst / CONFIG_FILE)
    writer = StreamingSafetensorsWriter(dst / WEIGHTS_FILE, specs, {"format": "pt", "longmoe": "1"})
    try:
        pending: dict[str, torch.Tensor] = {}  # target -> buffer being assembled
        seen: set[str] = set()
        unknown: list[str] = []
        for raw_name, raw in _tensors(files):
            if raw_name == "lm_head.weight" and cfg.tie_embeddings:
                continue
            for name, t in canonical_pieces(raw_name, raw, cfg):
                if name not in smap:
                    if not (t.numel() == 0 and "shared_experts" in name):  # n_shared = 0: a 0-wide MLP
                        unknown.append(raw_name)
                    continue
                if name in seen:
                    raise ConversionError(f"{src}: {name} appears twice")
                seen.add(name)
                piece, shape = smap[name]
                if tuple(t.shape) != shape:
                    raise ConversionError(
                        f"{raw_name}: expected shape {list(shape)} from config.json, got {list(t.shape)}"
                    )
                buf = pending.get(piece.target)
                if buf is None:
                    dt, tshape = specs[piece.target]
                    buf = pending[piece.target] = torch.zeros(tshape, dtype=dt)
                piece.write(buf, t)
                left[piece.target] -= 1
                if left[piece.target] == 0:
                    writer.write(piece.target, pending.pop(piece.target))
        if unknown:
            raise ConversionError(
                f"{src}: {len(unknown)} tensor(s) with no place in longmoe, e.g. {unknown[:5]}"
            )
        missing = sorted(set(smap) - seen)
        if missing:
            raise ConversionError(f"{src}: {len(missing)} tensor(s) missing, e.g. {missing[:5]}")
        for name in writer.missing:  # MoE balancer state (load window, counters): starts empty
            writer.write(name, torch.zeros(specs[name][1], dtype=specs[name][0]))
    except BaseException:
        writer.abort()  # the original error, not a list of tensors never written
        raise
    writer.close()
    record = {
        "direction": "from-hf",
        "source": str(src),
        "architecture": HF_ARCHITECTURE,
        "tokenizer": _carry_tokenizer(src, dst),
    }
    (dst / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return cfg


def to_hf(src: str | Path, dst: str | Path) -> dict:
    """Convert the longmoe model directory ``src`` into a transformers Kimi-Linear directory ``dst``.

    Raises ``ConversionError`` naming the field when Kimi-Linear cannot express ``src``'s config.
    A tied head is written out as ``lm_head.weight`` (transformers' Kimi-Linear does not tie).
    """
    src, dst = Path(src), Path(dst)
    cfg = ModelConfig.load(src / CONFIG_FILE)
    hf_cfg = config_to_hf(cfg.replace(tie_embeddings=False))
    tmap = target_map(cfg)
    if cfg.tie_embeddings:
        head = ("lm_head.weight", Piece("embed.weight"), (cfg.vocab_size, cfg.d_model))
        tmap["embed.weight"] = [*tmap["embed.weight"], head]
    dt = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
    specs = {
        hf_name: (torch.float32 if hf_name.endswith(_HF_FP32) else dt, shape)
        for pieces in tmap.values()
        for hf_name, _, shape in pieces
    }
    dst.mkdir(parents=True, exist_ok=True)
    writer = StreamingSafetensorsWriter(dst / WEIGHTS_FILE, dict(sorted(specs.items())), {"format": "pt"})
    try:
        for name, t in _tensors([src / WEIGHTS_FILE]):
            for hf_name, piece, shape in tmap.get(name, ()):
                writer.write(hf_name, piece.read(t, shape))
    except BaseException:
        writer.abort()  # the original error, not a list of tensors never written
        raise
    writer.close()
    (dst / CONFIG_FILE).write_text(json.dumps(hf_cfg, indent=2) + "\n")
    if (src / TOKENIZER_FILE).is_file():
        shutil.copyfile(src / TOKENIZER_FILE, dst / TOKENIZER_FILE)
    return hf_cfg
