"""The evaluation's user error: a bad flag combination or value (one line on the CLI, exit status 2)."""

from __future__ import annotations

from longmoe.errors import UserError


class EvalError(UserError, ValueError):
    """An evaluation flag or input the user can fix; the message names it."""


def check_positive(flag: str, value: int) -> None:
    """Raise ``EvalError`` unless ``value`` (given as ``flag``) is an integer >= 1."""
    if value < 1:
        raise EvalError(f"{flag} {value} is invalid: expected an integer >= 1")
