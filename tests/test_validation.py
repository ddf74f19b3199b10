"""longmoe.validation: one check, its error names the field, the value and what is allowed, in the
wording and the error type the caller picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from longmoe.errors import UserError
from longmoe.validation import (
    ASSIGN_MESSAGE,
    FLAG_MESSAGE,
    ConfigError,
    check,
    check_int_range,
    check_positive,
)


def test_a_failed_check_names_field_value_and_allowed():
    check(True, "x", 0, "anything")
    with pytest.raises(
        ConfigError, match=r"^config field 'lr' = 2 is invalid: expected a number in \(0, 1\)$"
    ):
        check(False, "lr", 2, "a number in (0, 1)")
    assert issubclass(ConfigError, UserError) and issubclass(ConfigError, ValueError)


def test_the_caller_picks_the_error_type_and_wording():
    class EnvError(ValueError):
        pass

    with pytest.raises(EnvError, match=r"^horizon=0 is invalid: expected an integer in \[1, 8\]$"):
        check_int_range("horizon", 0, 1, 8, EnvError, ASSIGN_MESSAGE)
    with pytest.raises(ConfigError, match=r"^max_batch: expected an integer >= 1, got 0$"):
        check_int_range("max_batch", 0, 1, message=FLAG_MESSAGE)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "1", None])
def test_positive_integers_exclude_booleans_floats_and_strings(bad):
    check_positive(SimpleNamespace(n=3), "n")
    with pytest.raises(ConfigError, match="'ffn.n' .* expected a positive integer"):
        check_positive(SimpleNamespace(n=bad), "n", prefix="ffn.")
