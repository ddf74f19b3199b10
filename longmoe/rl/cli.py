"""``longmoe rl``: agentic RL from a (SFT) model on a tool environment (new run or ``--resume``).

Every ``RLConfig`` field is an option (``--kl-coef 0``, ``--step-adv-weight 0``, ``--freeze-router``),
its help the field's comment; ``--config rl.json`` loads a whole config first, options override it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import re
import typing
from pathlib import Path
from typing import Any

from longmoe.config import ConfigError
from longmoe.configio import load_json
from longmoe.rl.config import LEGACY_ENGINE_FIELDS, RL_CONFIG, RLConfig
from longmoe.rl.plots import render
from longmoe.rl.trainer import RLTrainer
from longmoe.serve.engine_config import EngineConfig
from longmoe.train.run import is_resumed


def field_help() -> dict[str, str]:
    """Each ``RLConfig`` field's trailing comment in its source (the one place the meaning is written)."""
    out = {}
    for line in inspect.getsource(RLConfig).splitlines():
        m = re.match(r"\s+(\w+): [^=]+=.*?#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _bool(s: str) -> bool:
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


OFF = object()  # an optional number turned off on the command line ("none")


def _optional_float(s: str) -> float | object:
    if s.lower() in ("none", "null", "off"):
        return OFF
    try:
        return float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or none, got {s!r}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="the RL run directory (created, or resumed with --resume)")
    p.add_argument("--resume", action="store_true", help="continue the run from its newest checkpoint")
    p.add_argument("--config", type=Path, help="an RLConfig JSON file (options below override its fields)")
    p.add_argument("--max-steps", type=int, help="stop (with a checkpoint) after this many steps in total")
    g = p.add_argument_group("RLConfig")
    helps, hints = field_help(), typing.get_type_hints(RLConfig)
    for f in dataclasses.fields(RLConfig):
        t = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if f.name == "engine":
            add_engine_arguments(g, default)
            continue
        h = f"{helps.get(f.name, f.name)} (default: {json.dumps(default)})"
        flag = "--" + f.name.replace("_", "-")
        if t is bool:
            g.add_argument(flag, dest=f.name, type=_bool, nargs="?", const=True, help=h)
        elif t in (int, float, str):
            g.add_argument(flag, dest=f.name, type=t, help=h)
        elif t == float | None:
            g.add_argument(flag, dest=f.name, type=_optional_float, help=h + "; 'none' turns it off")
        elif f.name == "horizons":
            g.add_argument(flag, dest=f.name, type=int, nargs="+", help=h)
        else:  # dicts
            g.add_argument(flag, dest=f.name, type=json.loads, help=h + "; a JSON object")


def add_engine_arguments(g: argparse._ArgumentGroup, default: EngineConfig) -> None:
    """``--engine`` (a JSON object of ``EngineConfig`` fields) and a flag for each of the engine
    fields RL tunes most (``--max-batch``, ``--prefill-chunk``)."""
    g.add_argument(
        "--engine", type=json.loads, help="the rollout engine's options (EngineConfig fields), a JSON "
        f"object; fields not given keep their defaults ({json.dumps(dataclasses.asdict(default))})",
    )  # fmt: skip
    helps = {
        "max_batch": "engine: episodes decoding at once",
        "prefill_chunk": "engine: prompt tokens per scheduler step",
    }
    for name in LEGACY_ENGINE_FIELDS:
        h = f"{helps[name]} (default: {getattr(default, name)})"
        g.add_argument("--" + name.replace("_", "-"), dest=name, type=int, help=h)


def config_from_args(args: argparse.Namespace) -> RLConfig:
    base: dict[str, Any] = load_json(args.config) if args.config else {}
    for f in dataclasses.fields(RLConfig):
        v = getattr(args, f.name, None)
        if v is not None:
            base[f.name] = None if v is OFF else v
    for name in LEGACY_ENGINE_FIELDS:  # engine shortcuts win over --engine and the config file
        v = getattr(args, name, None)
        if v is not None:
            base.pop(name, None)
            engine = base.get("engine")
            base["engine"] = {**(engine if isinstance(engine, dict) else {}), name: v}
    return RLConfig.from_dict(base, where=str(args.config) if args.config else "options")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = None if is_resumed(args.run_dir, args.resume, RL_CONFIG) else config_from_args(args)
    if cfg is not None and not cfg.init:
        raise ConfigError("--init: expected the model directory or run to start RL from")
    trainer = RLTrainer(args.run_dir, cfg, resume=args.resume, max_steps=args.max_steps)
    last = trainer.fit()
    for path in render(args.run_dir):
        print(f"wrote {path}")
    print(json.dumps({k: v for k, v in last.items() if not isinstance(v, list)}))
    return 0
