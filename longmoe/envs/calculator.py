"""Calculator word problems: a story of ``horizon`` operations on a stock, and a ``calc`` tool.

A task starts with a stock of items and changes it ``horizon`` times (deliveries add, sales
subtract, repacking multiplies, sharing divides exactly); the question asks for the final count.
The tool ``calc(expression)`` evaluates arithmetic safely (``envs.safe_calc``, never ``eval``).
The expert computes one operation per call (``calc("576 - 17")``), then answers with the number.

Answer: the final turn's content, stripped of whitespace, quotes and one trailing period, must equal
the final count written as a plain integer (``559``). The knowledge state is how many of the story's
operations, from the first, the agent has obtained the result of from the tool (every intermediate
count is distinct, so a result is never known before its operation is computed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from longmoe.data.chat import AssistantTurn, ToolCall
from longmoe.envs.safe_calc import CalcError, evaluate, format_number
from longmoe.envs.toolenv import ToolEnv, ToolError, check_range, function_schema
from longmoe.tasks.base import ADJECTIVES, PLACES

MAX_HORIZON = 64
_CONTAINERS = ("crates", "jars", "boxes", "bottles", "barrels", "sacks", "lanterns", "kettles")
MAX_VALUE = 10**9  # every intermediate count stays in [1, MAX_VALUE]

_TEMPLATES = {
    "+": ("A delivery brings {n} more {unit}.", "Then {n} {unit} are returned by a customer."),
    "-": ("Then {n} {unit} are sold.", "{n} {unit} are lost in transit."),
    "*": (
        "Every one of the {unit} is then swapped for {n} new ones.",
        "The stock then grows {n}-fold.",
    ),
    "//": ("The {unit} are then shared equally among {n} shops, and one shop's share is kept.",),
}


@dataclass(frozen=True)
class CalculatorConfig:
    """``horizon``: operations in the story (= calc calls the expert makes), 1..64;
    ``max_operand``: the largest number an operation uses (2..10**6);
    ``max_start``: the largest starting stock (10..10**6; the start is drawn from 10..max_start);
    ``max_turns``: assistant turns before the episode is cut (0: ``2 * horizon + 4``);
    ``corrections``: operations whose number the story first states wrongly and corrects at its end
    (0..horizon; the steps are then numbered); ``distractors``: sentences about other depots (0..256)."""

    horizon: int = 2
    max_operand: int = 99
    max_start: int = 999
    max_turns: int = 0
    corrections: int = 0
    distractors: int = 0

    def __post_init__(self) -> None:
        check_range("horizon", self.horizon, 1, MAX_HORIZON)
        check_range("max_operand", self.max_operand, 2, 10**6)
        check_range("max_start", self.max_start, 10, 10**6)
        check_range("max_turns", self.max_turns, 0, 10_000)
        check_range("corrections", self.corrections, 0, self.horizon)
        check_range("distractors", self.distractors, 0, 256)


def _draw_ops(
    rng: random.Random, start: int, horizon: int, max_operand: int
) -> tuple[list[tuple[str, int]], list[int]]:
    """``horizon`` (op, operand) pairs whose running count stays a whole number in [1, MAX_VALUE],
    and the counts: the start, then the count after each operation."""
    ops, v, values = [], start, [start]
    for _ in range(horizon):
        while True:
            op = rng.choice(("+", "-", "*", "//"))
            n = rng.randint(2, max_operand)
            if op == "-" and n >= v:
                continue
            if op == "*" and v * n > MAX_VALUE:
                continue
            if op == "+" and v + n > MAX_VALUE:
                continue
            if op == "//":
                divisors = [d for d in range(2, min(max_operand, v) + 1) if v % d == 0]
                if not divisors:
                    continue
                n = rng.choice(divisors)
            new = v + n if op == "+" else v - n if op == "-" else v * n if op == "*" else v // n
            if new not in values:  # distinct counts: no step's result is known before it is computed
                break
        ops.append((op, n))
        v = new
        values.append(v)
    return ops, values


class CalculatorEnv(ToolEnv):
    """Word problems over a running count, solved with a safe ``calc`` tool."""

    name = "calculator"
    tools = [
        function_schema(
            "calc",
            "Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses).",
            {"expression": ("string", "the expression, e.g. '(12 + 3) * 4'")},
        )
    ]
    instructions = (
        "You solve word problems. Use the calc tool for every arithmetic step. "
        "When you know the result, reply with the final number only."
    )

    def __init__(self, config: CalculatorConfig | None = None) -> None:
        self.config = config or CalculatorConfig()
        c = self.config
        super().__init__(c.horizon, c.max_turns or 2 * c.horizon + 4)

    def _draw(self, seed: int) -> str:
        c = self.config
        rng = random.Random(f"longmoe-env:calculator:{c.horizon}:{c.max_operand}:{seed}")
        unit = f"{rng.choice(ADJECTIVES)} {rng.choice(_CONTAINERS)}"
        start = rng.randint(10, c.max_start)
        self.ops, self.values = _draw_ops(rng, start, c.horizon, c.max_operand)
        place = rng.choice(PLACES)
        story = [f"A depot in {place} holds {start} {unit}."]
        story += [rng.choice(_TEMPLATES[op]).format(n=n, unit=unit) for op, n in self.ops]
        self.seen: set[str] = set()  # results the tool has returned
        if not (c.corrections or c.distractors):  # the original task text, unchanged
            return " ".join(story) + f" How many {unit} are there at the end?"
        # corrections: a wrong number in the step, the right one in a note after the story
        fixed = sorted(rng.sample(range(c.horizon), c.corrections))
        notes = []
        for k in fixed:
            op, n = self.ops[k]
            wrong = next(w for w in iter(lambda: rng.randint(2, max(3, c.max_operand)), None) if w != n)
            story[k + 1] = rng.choice(_TEMPLATES[op]).format(n=wrong, unit=unit)
            notes.append(f"Correction: in step {k + 1} the number is {n}, not {wrong}.")
        steps = [story[0]] + [f"({k + 1}) {t}" for k, t in enumerate(story[1:])]
        for _ in range(c.distractors):  # facts about other depots: never part of the count
            other = rng.choice([p for p in PLACES if p != place])
            fact = f"Meanwhile a depot in {other} holds {rng.randint(10, c.max_start)} {unit}."
            steps.insert(rng.randint(1, len(steps)), fact)
        return " ".join(steps + notes) + f" How many {unit} are there at the end in {place}?"

    @property
    def answer(self) -> str:
        return str(self.values[-1])

    def _run(self, name: str, arguments: dict[str, Any]) -> str:
        try:
            value = evaluate(arguments["expression"])
        except CalcError as e:
            raise ToolError(str(e)) from None
        text = format_number(value)
        self.seen.add(text)
        return text

    def progress(self) -> int:
        """How many operations, from the first, the agent has the results of (the knowledge state)."""
        k = 0
        while k < self.horizon and str(self.values[k + 1]) in self.seen:
            k += 1
        return k

    def state_key(self) -> str:
        return f"calculator:{self.seed}:{self.progress()}"

    def expert(self) -> AssistantTurn:
        step = self.progress()
        if step == self.horizon:
            return AssistantTurn(self.answer)
        op, n = self.ops[step]
        return AssistantTurn("", (ToolCall("calc", {"expression": f"{self.values[step]} {op} {n}"}),))
