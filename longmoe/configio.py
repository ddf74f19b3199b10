"""Config files as dataclasses: ``JsonConfig`` (``to_dict`` / ``from_dict`` / ``save`` / ``load``) and
``dataclass_from_dict`` are the one implementation of reading a config file. Unknown fields, nested
configs and field types are checked here, and the errors name the file and the field.

Every config dataclass (``ModelConfig``, ``TrainConfig``, ``RLConfig``, recipe configs) uses it; the
range checks of each field are the config's own (``longmoe.validation``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from longmoe.validation import ConfigError, check

C = TypeVar("C")

_TYPE_NAMES = {int: "an integer", float: "a float", bool: "a boolean", str: "a string"}


def _describe(t: Any) -> str:
    """``float | None`` -> "null or a float": the expected type in words, for error messages."""
    if t in _TYPE_NAMES:
        return _TYPE_NAMES[t]
    args = typing.get_args(t)
    origin = typing.get_origin(t)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin is list:
        return f"a list, each item {_describe(args[0])}" if args else "a list"
    if origin is dict:
        return f"an object, each value {_describe(args[1])}" if args else "an object"
    if dataclasses.is_dataclass(t):
        return f"a {t.__name__} (an object of its fields)"
    return f"a {getattr(t, '__name__', t)}"


def _is_type(v: Any, t: Any) -> bool:
    """``v`` holds type ``t`` (an annotation: a scalar, ``X | None``, ``list[X]``, ``dict[str, X]``,
    a dataclass). Integers count as floats; booleans count as neither."""
    if t is Any:
        return True
    if t is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if t in (bool, str):
        return isinstance(v, t)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (types.UnionType, typing.Union):
        return any(v is None if a is type(None) else _is_type(v, a) for a in args)
    if origin is list:
        return isinstance(v, (list, tuple)) and (not args or all(_is_type(x, args[0]) for x in v))
    if origin is dict:
        return isinstance(v, dict) and (
            not args or all(_is_type(k, args[0]) and _is_type(x, args[1]) for k, x in v.items())
        )
    if origin is tuple:
        return isinstance(v, tuple)
    return isinstance(t, type) and isinstance(v, t)


def check_types(obj: Any, prefix: str = "") -> None:
    """Every field of the dataclass ``obj`` holds its annotated type; otherwise a ``ConfigError``
    naming the field (``prefix`` + name), the value and the expected type."""
    for name, t in typing.get_type_hints(type(obj)).items():
        if name in {f.name for f in dataclasses.fields(obj)}:
            v = getattr(obj, name)
            check(_is_type(v, t), f"{prefix}{name}", v, _describe(t))


def _dataclass_item(t: Any) -> Any:
    """The dataclass that ``t`` (``X``, ``X | None`` or ``list[X]``) holds, else None."""
    if dataclasses.is_dataclass(t):
        return t
    inner = [a for a in typing.get_args(t) if dataclasses.is_dataclass(a)]
    return inner[0] if inner else None


def dataclass_from_dict(cls: type[C], d: Any, where: str | None = None, prefix: str = "") -> C:
    """``cls(**d)`` for a config dataclass, from parsed JSON: unknown fields are rejected and nested
    config dataclasses (a field ``X`` or ``list[X]``) are built from their dicts. A ``ConfigError``
    names the field (``prefix`` + name) and, with ``where`` (e.g. the file), where it came from."""
    try:
        if not isinstance(d, dict):
            raise ConfigError(f"{prefix or 'config'} must be a JSON object, got {type(d).__name__}")
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(
                f"unknown config field(s) {[prefix + k for k in unknown]}; known fields: {sorted(known)}"
            )
        kwargs = dict(d)
        for name, v in d.items():
            sub = _dataclass_item(hints[name])
            if sub is None:
                continue
            if isinstance(v, dict):
                kwargs[name] = dataclass_from_dict(sub, v, prefix=f"{prefix}{name}.")
            elif typing.get_origin(hints[name]) is list and isinstance(v, list):
                kwargs[name] = [
                    dataclass_from_dict(sub, x, prefix=f"{prefix}{name}[{i}].") if isinstance(x, dict) else x
                    for i, x in enumerate(v)
                ]
        return cls(**kwargs)
    except ConfigError as e:
        if where is None:
            raise
        raise ConfigError(f"{where}: {e}") from e


def load_json(path: str | Path) -> Any:
    """Parsed JSON of a config file; ``FileNotFoundError`` / ``ConfigError`` name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:  # a binary file is not JSON either
        raise ConfigError(f"{path} is not valid JSON: {e}") from e


def save_json(path: str | Path, d: Any) -> None:
    Path(path).write_text(json.dumps(d, indent=2) + "\n")


class JsonConfig:
    """JSON I/O shared by the config dataclasses (``ModelConfig``, ``TrainConfig``, recipe configs):
    ``from_dict``/``load`` go through ``dataclass_from_dict``, so every config file is checked the same
    way and its errors name the file and the field."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[C], d: dict[str, Any], where: str | None = None) -> C:
        return dataclass_from_dict(cls, d, where)

    def save(self, path: str | Path) -> None:
        save_json(path, self.to_dict())

    @classmethod
    def load(cls: type[C], path: str | Path) -> C:
        return cls.from_dict(load_json(path), where=str(path))  # type: ignore[attr-defined]
