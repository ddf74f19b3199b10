"""A safe arithmetic evaluator for the calculator tool: an AST walk, never ``eval``.

Accepted: integer and decimal literals, ``+ - * / // % **``, unary ``+``/``-`` and parentheses.
Anything else (names, calls, attributes, strings, comparisons, ...) is refused, and so is anything
that could take long or huge memory: expressions over ``MAX_EXPR_CHARS`` characters or
``MAX_NODES`` syntax nodes, literals or intermediate results beyond ``MAX_ABS`` in magnitude, and
exponents beyond ``MAX_EXPONENT``. Errors raise ``CalcError`` with a message meant for the model.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from collections.abc import Callable

MAX_EXPR_CHARS = 200
MAX_NODES = 64
MAX_ABS = 10**15
MAX_EXPONENT = 64

Number = int | float


class CalcError(ValueError):
    """An expression the calculator refuses or cannot evaluate."""


def _div(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b  # exact integer quotients stay integers
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("modulo by zero")
    return a % b


def _pow(a: Number, b: Number) -> Number:
    if abs(b) > MAX_EXPONENT:
        raise CalcError(f"exponent {b} is too large (at most {MAX_EXPONENT} in magnitude)")
    if a == 0 and b < 0:
        raise CalcError("zero to a negative power")
    if abs(a) > 1 and math.log10(abs(a)) * b > math.log10(MAX_ABS):  # refuse before computing
        raise CalcError(f"result is too large (over {MAX_ABS:.0e} in magnitude)")
    out = a**b
    if isinstance(out, complex):
        raise CalcError("negative number to a fractional power")
    return out


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _div,
    ast.FloorDiv: _floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _checked(x: Number) -> Number:
    if isinstance(x, float) and not math.isfinite(x):
        raise CalcError("result is not a finite number")
    if abs(x) > MAX_ABS:
        raise CalcError(f"result is too large (over {MAX_ABS:.0e} in magnitude)")
    return x


def _walk(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        v = node.value
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CalcError(f"only numbers are allowed, got {v!r}")
        return _checked(v)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _checked(_BINARY[type(node.op)](_walk(node.left), _walk(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_walk(node.operand)))
    raise CalcError(
        f"unsupported syntax: {type(node).__name__} (only numbers, + - * / // % ** and parentheses)"
    )


def evaluate(expr: str) -> Number:
    """The value of an arithmetic expression (see the module docstring for what is accepted)."""
    if not isinstance(expr, str):
        raise CalcError("the expression must be a string")
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError(f"expression is too long ({len(expr)} characters, at most {MAX_EXPR_CHARS})")
    if not expr.strip():
        raise CalcError("the expression is empty")
    try:
        with warnings.catch_warnings():  # "1and 2": CPython warns on stderr; to the model it is an error
            warnings.simplefilter("error", SyntaxWarning)
            tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, SyntaxWarning) as e:
        raise CalcError(f"syntax error: {getattr(e, 'msg', e)}") from None
    n = sum(1 for _ in ast.walk(tree))
    if n > MAX_NODES:
        raise CalcError(f"expression is too complex ({n} syntax nodes, at most {MAX_NODES})")
    return _walk(tree.body)


def format_number(x: Number) -> str:
    """Results as read: integers (and integral floats) without a point, else 10 significant digits."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    if isinstance(x, float):
        return f"{x:.10g}"
    return str(x)
