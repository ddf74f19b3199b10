"""Seeded tool-using environments for agentic SFT, RL and agent evaluation (see ``envs.base``).

``ENVS`` maps a name to its typed config class and constructor; ``make_env(name, **fields)``
builds one (``make_env("doclookup", horizon=4, page_chars=2000)``). Every config has ``horizon``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from longmoe.envs.base import HELD_OUT_SEED_BASE, Env, EnvConfigError, StepResult
from longmoe.envs.calculator import CalculatorConfig, CalculatorEnv
from longmoe.envs.doclookup import DocLookupConfig, DocLookupEnv
from longmoe.envs.episode import Episode, assistant_message, play
from longmoe.envs.sql import SQLConfig, SQLEnv

__all__ = [
    "ENVS",
    "HELD_OUT_SEED_BASE",
    "CalculatorConfig",
    "CalculatorEnv",
    "DocLookupConfig",
    "DocLookupEnv",
    "Env",
    "EnvConfigError",
    "EnvEntry",
    "Episode",
    "SQLConfig",
    "SQLEnv",
    "StepResult",
    "assistant_message",
    "env_config",
    "make_env",
    "play",
]


@dataclass(frozen=True)
class EnvEntry:
    """A registered environment: its config dataclass and the constructor taking one."""

    config: type
    build: Callable[[Any], Env]


ENVS: dict[str, EnvEntry] = {
    "doclookup": EnvEntry(DocLookupConfig, DocLookupEnv),
    "calculator": EnvEntry(CalculatorConfig, CalculatorEnv),
    "sql": EnvEntry(SQLConfig, SQLEnv),
}


def env_config(name: str, **values: Any) -> Any:
    """The typed config of environment ``name`` with ``values`` set (unknown fields are an error)."""
    if name not in ENVS:
        raise EnvConfigError(f"environment {name!r} is unknown: expected one of {sorted(ENVS)}")
    cls = ENVS[name].config
    known = {f.name for f in fields(cls)}
    bad = sorted(set(values) - known)
    if bad:
        raise EnvConfigError(f"environment {name!r} has no config field(s) {bad}: expected {sorted(known)}")
    return cls(**values)


def make_env(name: str, **values: Any) -> Env:
    """A fresh environment ``name`` built from its config with ``values`` set."""
    config = env_config(name, **values)
    return ENVS[name].build(config)
