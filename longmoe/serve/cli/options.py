"""The options every serving command shares: one flag per ``EngineConfig`` field, generated from the
dataclass (type, default and help text from the field and its comment, so a default exists once),
and the sampling flags.

A field's help is its trailing comment, or the comment lines right above it. A few fields are shown
in friendlier units (``FLAG_UNITS``: ``--cache-budget-mb`` for ``cache_budget_bytes``)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
import typing

from longmoe.cli.argtypes import device
from longmoe.ops.quant import MODES as QUANT_MODES
from longmoe.serve.engine import Engine
from longmoe.serve.engine_config import EngineConfig
from longmoe.serve.sampling import SamplingParams

# field -> (flag, unit in bytes): shown and parsed in that unit
FLAG_UNITS = {"cache_budget_bytes": ("--cache-budget-mb", 2**20), "max_image_bytes": ("--max-image-kb", 1024)}
UNIT_NAMES = {2**20: "MiB", 1024: "KiB"}
CHOICES = {"quantize": QUANT_MODES}
TYPES = {"device": device}


def field_docs(cls: type) -> dict[str, str]:
    """Each dataclass field's comment in ``cls``'s source: trailing, or the comment lines above it."""
    out, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        s = line.strip()
        if s.startswith("#"):
            above.append(s.lstrip("# ").strip())
            continue
        m = re.match(r"(\w+): [^=]+=.*?(?:#\s*(.+))?$", s)
        if m and not s.startswith(("def ", "return")):
            doc = m.group(2) or " ".join(above)
            if doc:
                out[m.group(1)] = doc
        above = []
    return out


def _flag_type(t: object) -> type:
    """``int | None`` -> int; the scalar type of a field."""
    if isinstance(t, types.UnionType) or typing.get_origin(t) is typing.Union:
        t = next(a for a in typing.get_args(t) if a is not type(None))
    assert isinstance(t, type)
    return t


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """``--model`` and a flag for every ``EngineConfig`` field (``--prefill-chunk``, ``--compile`` /
    ``--no-compile``, ...), each defaulting to the field's default."""
    p.add_argument("--model", required=True, help="model directory, or a training run directory")
    g = p.add_argument_group("engine (EngineConfig)")
    docs, hints, default = field_docs(EngineConfig), typing.get_type_hints(EngineConfig), EngineConfig()
    for f in dataclasses.fields(EngineConfig):
        t, value = _flag_type(hints[f.name]), getattr(default, f.name)
        flag, unit = FLAG_UNITS.get(f.name, ("--" + f.name.replace("_", "-"), 1))
        if unit != 1:
            value = value / unit
        shown = "off" if value is None else value
        unit_name = f", in {UNIT_NAMES[unit]}" if unit != 1 else ""
        h = f"{docs.get(f.name, f.name)} (default: {shown}{unit_name})"
        if t is bool:
            g.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=value, help=h)
        else:
            kind = float if unit != 1 else TYPES.get(f.name, t)
            meta = None if f.name in CHOICES else flag[2:].upper().replace("-", "_")
            g.add_argument(
                flag, dest=f.name, type=kind, default=value, choices=CHOICES.get(f.name), metavar=meta, help=h
            )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The ``EngineConfig`` the flags describe (validated: a bad value is a one-line ``ValueError``)."""
    opts = {}
    for f in dataclasses.fields(EngineConfig):
        v = getattr(args, f.name)
        unit = FLAG_UNITS.get(f.name, ("", 1))[1]
        opts[f.name] = v if unit == 1 or v is None else int(v * unit)
    return EngineConfig(**opts)


def engine_from_args(args: argparse.Namespace) -> Engine:
    return Engine.from_dir(args.model, **dataclasses.asdict(engine_config_from_args(args)))


def add_sampling_arguments(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate ({max_tokens})")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (1 = off; 0.95)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1.0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI frequency penalty (0)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed: same seed, same output")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def params_from_args(args: argparse.Namespace, **extra: object) -> SamplingParams:
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
        stop=list(args.stop),
        **extra,
    )
