"""The one way a config field is checked: ``check(cond, name, value, allowed)`` raises an error that
names the field, its value and what is allowed, so a user editing a file or a flag knows what to fix.

Every config dataclass (model, train, SFT, RL, data stages, engine, rollout, environments) validates
through these helpers. The error type and the message's wording are parameters, so a module keeps the
exception its callers catch (``EnvConfigError``) and the wording its users already see.
"""

from __future__ import annotations

from typing import Any

from longmoe.errors import UserError


class ConfigError(UserError, ValueError):
    """A config field holds a value outside its allowed range."""


# How a failed check reads (``str.format`` fields: name, value, allowed):
FIELD_MESSAGE = "config field '{name}' = {value!r} is invalid: expected {allowed}"  # config files
FLAG_MESSAGE = "{name}: expected {allowed}, got {value!r}"  # engine and rollout options
ASSIGN_MESSAGE = "{name}={value!r} is invalid: expected {allowed}"  # environment requests


def check(
    cond: bool,
    name: str,
    value: Any,
    allowed: str,
    error: type[Exception] = ConfigError,
    message: str = FIELD_MESSAGE,
) -> None:
    """Raise ``error`` (the field ``name`` = ``value``, expected ``allowed``) unless ``cond`` holds."""
    if not cond:
        raise error(message.format(name=name, value=value, allowed=allowed))


def is_int(v: Any) -> bool:
    """An integer that is not a boolean (JSON ``true`` must not pass as 1)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_positive_int(v: Any) -> bool:
    return is_int(v) and v > 0


def check_positive(obj: Any, *names: str, prefix: str = "") -> None:
    """Each field ``names`` of ``obj`` is a positive integer (errors name ``prefix`` + the field)."""
    for n in names:
        v = getattr(obj, n)
        check(is_positive_int(v), prefix + n, v, "a positive integer")


def check_int_range(
    name: str,
    value: Any,
    lo: int,
    hi: int | None = None,
    error: type[Exception] = ConfigError,
    message: str = FIELD_MESSAGE,
) -> None:
    """``value`` is an integer in ``[lo, hi]`` (``hi`` None: ``>= lo``)."""
    ok = is_int(value) and value >= lo and (hi is None or value <= hi)
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    check(ok, name, value, allowed, error, message)
