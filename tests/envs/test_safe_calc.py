"""The calculator's evaluator: right values on arithmetic, refusal of everything else and of huge work."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longmoe.envs.safe_calc import MAX_ABS, MAX_EXPR_CHARS, CalcError, evaluate, format_number


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(1 + 2) * 3", 9),
        ("7 // 2", 3),
        ("7 % 3", 1),
        ("2 ** 10", 1024),
        ("-3 + +4", 1),
        ("6 / 3", 2),
        ("7 / 2", 3.5),
        ("1.5 * 4", 6.0),
        ("  536 // 8 ", 67),
    ],
)
def test_values(expr: str, value: float) -> None:
    assert evaluate(expr) == value


def test_exact_integer_division_stays_integer() -> None:
    assert isinstance(evaluate("6 / 3"), int)
    assert format_number(evaluate("6 / 3")) == "2"
    assert format_number(evaluate("1 / 3")) == "0.3333333333"
    assert format_number(2.0) == "2"


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os').system('echo hi')",
        "open('x')",
        "x + 1",
        "(1).real",
        "'a' * 3",
        "[1, 2]",
        "1 if 1 else 2",
        "1 < 2",
        "True + 1",
        "1j",
        "lambda: 1",
        "1; 2",
        "",
        "1 +",
    ],
)
def test_refuses_anything_but_arithmetic(expr: str) -> None:
    with pytest.raises(CalcError):
        evaluate(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "9 ** 9 ** 9",
        "10 ** 100",
        "2 ** 65",
        "10 ** 15 * 10",
        "1e308 * 10",
        "1 / 0",
        "1 // 0",
        "1 % 0",
        "0 ** -1",
        "(-8) ** 0.5",
        "+".join(["1"] * 40),
        "1" * (MAX_EXPR_CHARS + 1),
        "(" * 150 + "1" + ")" * 150,
    ],
)
def test_refuses_huge_or_undefined_work(expr: str) -> None:
    with pytest.raises(CalcError):
        evaluate(expr)


def test_non_string_is_refused() -> None:
    with pytest.raises(CalcError):
        evaluate(12)  # type: ignore[arg-type]


_ints = st.integers(min_value=0, max_value=999)


def _apply(a: tuple[str, int, int], op: str, b: tuple[str, int, int]) -> tuple[str, int, int]:
    """(expression, exact value, largest magnitude of any intermediate result)."""
    v = a[1] + b[1] if op == "+" else a[1] - b[1] if op == "-" else a[1] * b[1]
    return f"({a[0]} {op} {b[0]})", v, max(a[2], b[2], abs(v))


_exprs = st.recursive(
    _ints.map(lambda n: (str(n), n, n)),
    lambda sub: st.tuples(sub, st.sampled_from("+-*"), sub).map(lambda t: _apply(*t)),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(_exprs)
def test_matches_integer_arithmetic(pair: tuple[str, int, int]) -> None:
    """Fully parenthesised + - * trees over small integers evaluate to their exact value; a tree
    with an intermediate result beyond MAX_ABS (six factors of up to 999 reach 10^18) is refused."""
    expr, value, peak = pair
    if peak > MAX_ABS:
        with pytest.raises(CalcError, match="too large"):
            evaluate(expr)
    else:
        assert evaluate(expr) == value


@pytest.mark.parametrize("expr", ["1and 2", "3if 1 else 2", "1__0"])
def test_literal_glued_to_a_word_is_a_quiet_syntax_error(expr: str) -> None:
    """CPython only warns on ``1and`` (a SyntaxWarning on stderr, once per rollout); the model gets
    a syntax error and nothing is printed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(CalcError, match="syntax error"):
            evaluate(expr)
    assert not caught, [str(w.message) for w in caught]
