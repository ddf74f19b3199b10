"""Enforcing ``tool_choice`` while decoding: a forced call, or no call at all.

A tool call is ``<|tool_call|>{"name": ..., "arguments": {...}}`` closed by ``<|end|>``
(``longmoe.data.chat``). ``tool_choice: "required"`` (or a named function) must yield such a call
whatever the model's weights are, so the call is decoded under a constraint:

- ``ForcedCall`` forces the ``<|tool_call|>`` token first (grammars over text cannot name a
  special token), then hands over to the JSON grammar of ``call_schema(tools)``: an object whose
  ``name`` is one of the allowed tools and whose ``arguments`` match that tool's ``parameters``.
  The request ends (``"stop"``) when the JSON closes, so exactly one call is made.
- ``BannedTokens`` implements ``tool_choice: "none"``: the ``<|tool_call|>`` token is never sampled.

``"auto"`` decodes freely; what the model wrote is parsed afterwards (``parse_assistant``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from longmoe.serve.sampling import TokenConstraint
from longmoe.serve.structured import JsonFormat, JsonGrammars

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function", tool)


def call_schema(tools: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
    """The JSON Schema of one call of any of ``tools`` (or only of the tool named ``name``):
    ``{"name": <that name>, "arguments": <its parameters>}``, both required, nothing else."""
    options = []
    for tool in tools:
        fn = _function(tool)
        if name is not None and fn["name"] != name:
            continue
        options.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": fn["name"]},
                    "arguments": fn.get("parameters") or EMPTY_PARAMETERS,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not options:
        raise ValueError(f"no tool named {name!r}")
    return options[0] if len(options) == 1 else {"anyOf": options}


class ForcedCall:
    """Forces ``prefix`` token ids, then follows ``then`` (a grammar); done when ``then`` is."""

    def __init__(self, prefix: list[int], then: TokenConstraint) -> None:
        self.prefix, self.then, self.pos = list(prefix), then, 0
        self.then_accepted = 0  # tokens ``then`` accepted (``rollback`` splits ``n`` between the two)

    def mask(self, logits: torch.Tensor) -> None:
        if self.pos < len(self.prefix):
            keep = self.prefix[self.pos]
            v = logits[keep].clone()
            logits.fill_(float("-inf"))
            logits[keep] = v if torch.isfinite(v) else 0.0
        else:
            self.then.mask(logits)

    def accept(self, token: int) -> None:
        if self.pos < len(self.prefix):
            if token != self.prefix[self.pos]:
                raise RuntimeError(f"token {token} is not the forced token {self.prefix[self.pos]}")
            self.pos += 1
        else:
            self.then.accept(token)
            self.then_accepted += 1

    def rollback(self, n: int) -> None:
        if n > self.pos + self.then_accepted:
            raise ValueError(f"rollback: {n} tokens but only {self.pos + self.then_accepted} were accepted")
        m = min(n, self.then_accepted)
        if m:
            self.then.rollback(m)
            self.then_accepted -= m
        self.pos -= n - m

    @property
    def done(self) -> bool:
        return self.pos >= len(self.prefix) and self.then.done


class BannedTokens:
    """Never lets ``ids`` be sampled; never completes by itself."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = torch.tensor(ids, dtype=torch.long)

    def mask(self, logits: torch.Tensor) -> None:
        logits[self.ids.to(logits.device)] = float("-inf")

    def accept(self, token: int) -> None:
        pass

    def rollback(self, n: int) -> None:
        pass

    @property
    def done(self) -> bool:
        return False


def forced_call(
    grammars: JsonGrammars, tool_call_id: int, tools: list[dict[str, Any]], name: str | None = None
) -> Callable[[], TokenConstraint]:
    """A factory of ``ForcedCall`` constraints for a call of ``tools`` (or of ``name`` only); the
    grammar is compiled now (``StructuredOutputError`` on a schema xgrammar cannot compile)."""
    grammar = grammars.constraint(JsonFormat(call_schema(tools, name)))
    return lambda: ForcedCall([tool_call_id], grammar())


def no_call(tool_call_id: int) -> Callable[[], TokenConstraint]:
    """A factory of constraints that keep the model from opening a tool call."""
    return lambda: BannedTokens([tool_call_id])
