"""The shared episode machinery of the tool environments: argument checks, turn handling, counters.

``ToolEnv`` implements ``Env.step`` once for every environment: a malformed turn, a call to an
unknown tool or arguments that break the tool's JSON schema end the episode with reward 0 (counted
in ``info["malformed"]`` with the reason in ``info["malformed_reason"]``); a tool whose arguments
are well-formed but name something that does not exist (a document id, a page past the end, an
expression that does not evaluate) answers with an ``error: ...`` observation and the episode goes
on (counted in ``info["tool_errors"]``); a final answer ends the episode with reward 1 if it matches
(``answer_matches``), else 0; an episode that reaches ``max_turns`` ends with 0 (``truncated``).

A subclass draws its task in ``_draw(seed)``, runs tools in ``_run(name, arguments)`` and states its
answer, question, expert and ``state_key``.
"""

from __future__ import annotations

from typing import Any

from longmoe.data.chat import AssistantTurn
from longmoe.envs.base import EnvConfigError, Message, StepResult, describe_tools
from longmoe.validation import ASSIGN_MESSAGE, check, check_int_range, is_int

_JSON_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float)}


class ToolError(Exception):
    """A well-formed call the tool cannot serve: the message becomes the ``error: ...`` observation."""


def function_schema(name: str, description: str, params: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """An OpenAI function tool whose parameters are all required: ``{name: (json type, description)}``."""
    props = {k: {"type": t, "description": d} for k, (t, d) in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": list(params),
                "additionalProperties": False,
            },
        },
    }


def check_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` break the function ``schema`` (required, no extras, JSON types), or None."""
    params = schema["function"]["parameters"]
    props: dict[str, Any] = params["properties"]
    name = schema["function"]["name"]
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"{name}: missing argument(s) {missing}"
    extra = sorted(set(arguments) - set(props))
    if extra:
        return f"{name}: unexpected argument(s) {extra}"
    for k, v in arguments.items():
        want = props[k]["type"]
        if isinstance(v, bool) or not isinstance(v, _JSON_TYPES[want]):
            return f"{name}: argument {k!r} must be of type {want}, got {type(v).__name__}"
    return None


def normalize_answer(text: str) -> str:
    """The final answer as compared: surrounding whitespace, quotes and one trailing period dropped."""
    s = text.strip().strip("`\"'").strip()
    return s[:-1].rstrip() if s.endswith(".") else s


def answer_matches(content: str, answer: str) -> bool:
    """Exact match of the normalized final turn's content with the task's answer."""
    return normalize_answer(content) == answer


def check_range(field: str, value: int, lo: int, hi: int) -> None:
    """Config validation: ``lo <= value <= hi`` (ints only), else an ``EnvConfigError`` naming the field."""
    check_int_range(field, value, lo, hi, EnvConfigError, ASSIGN_MESSAGE)


class ToolEnv:
    """Base class of the environments: ``reset``/``step`` and the episode counters (see module doc)."""

    name = "toolenv"
    tools: list[dict[str, Any]] = []
    instructions = ""

    def __init__(self, horizon: int, max_turns: int) -> None:
        self._horizon, self.max_turns = horizon, max_turns
        self._schemas = {t["function"]["name"]: t for t in self.tools}
        self.seed: int | None = None
        self.done = True

    # ------------------------------------------------------------------ subclass hooks
    def _draw(self, seed: int) -> str:
        """Draw the task for ``seed`` (reset the knowledge state); returns the user's question."""
        raise NotImplementedError

    def _run(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one schema-checked call; returns the observation or raises ``ToolError``."""
        raise NotImplementedError

    @property
    def answer(self) -> str:
        """The right final answer of the current task."""
        raise NotImplementedError

    # ------------------------------------------------------------------ Env protocol
    @property
    def horizon(self) -> int:
        return self._horizon

    def reset(self, seed: int) -> list[Message]:
        check(
            is_int(seed) and seed >= 0, "seed", seed, "a non-negative integer", EnvConfigError, ASSIGN_MESSAGE
        )
        self.seed, self.done = seed, False
        self.turns, self.tool_calls, self.tool_errors = 0, 0, 0
        question = self._draw(seed)
        system = f"{self.instructions}\n\n{describe_tools(self.tools)}"
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    def info(self, **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "env": self.name,
            "seed": self.seed,
            "horizon": self.horizon,
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "malformed": 0,
            "truncated": False,
            "success": False,
        }
        out.update(extra)
        return out

    def _end(self, reward: float, messages: list[Message] | None = None, **extra: Any) -> StepResult:
        self.done = True
        return StepResult(messages or [], True, reward, self.info(success=reward > 0, **extra))

    def step(self, turn: AssistantTurn) -> StepResult:
        if self.done:
            raise RuntimeError(f"{self.name}: the episode is over; call reset(seed) first")
        self.turns += 1
        if turn.malformed is not None:
            return self._end(0.0, malformed=1, malformed_reason=turn.malformed)
        if turn.is_final:
            ok = answer_matches(turn.content, self.answer)
            return self._end(float(ok), answer=normalize_answer(turn.content))
        messages: list[Message] = []
        for call in turn.tool_calls:
            schema = self._schemas.get(call.name)
            why = (
                f"unknown tool {call.name!r}: expected one of {sorted(self._schemas)}"
                if schema is None
                else check_arguments(schema, call.arguments)
            )
            if why is not None:
                return self._end(0.0, malformed=1, malformed_reason=why)
            self.tool_calls += 1
            try:
                out = self._run(call.name, call.arguments)
            except ToolError as e:
                self.tool_errors += 1
                out = f"error: {e}"
            call_id = call.id or f"call_{self.tool_calls}"
            messages.append({"role": "tool", "tool_call_id": call_id, "name": call.name, "content": out})
        if self.turns >= self.max_turns:
            return self._end(0.0, messages, truncated=True)
        return StepResult(messages, False, 0.0, self.info())
