"""What one engine step hands from the scheduler to the model runner and back (vLLM v1's shape).

A step goes one way: ``Scheduler.schedule()`` returns a ``StepPlan``, ``ModelRunner.execute(plan)``
runs it and returns a ``StepOutput``, ``Scheduler.update(plan, output)`` records the tokens, emits
events, finishes requests and moves them between queues. The runner never calls the scheduler.

The runner finishes rows by the rules it can check alone (``Request.stop_reason``: a stop token, a
closed constraint, the length limit) so a finished row leaves its batch cache in the same step (and a
speculative row is rolled back to what it kept). What only the output side can see (a stop string in
the text, a consumer that raised, a cancellation) finishes the request in ``update``; its row leaves
the batch at the start of the next step (``StepPlan.leaving``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from longmoe.serve.sampling import TokenChoice

if TYPE_CHECKING:
    from longmoe.serve.request import Request

# how the runner may finish a row: a stop token (its text is not shown), the constraint closed (the
# token is the document's last), the length limit (max_tokens or the context window)
RUNNER_FINISHES = ("stop_token", "complete", "length")


@dataclass
class StepPlan:
    """What one step runs: rows ``leaving`` the batch first (request id -> whether its row is handed
    back, ``StepOutput.rows``), then a decode step over ``decode`` (the running batch), then one
    prefill chunk of ``chunk`` prompt tokens for each request of ``prefill``."""

    decode: list[Request] = field(default_factory=list)
    prefill: list[Request] = field(default_factory=list)
    chunk: int = 0
    leaving: dict[int, bool] = field(default_factory=dict)


@dataclass
class RowOutput:
    """A request's tokens of one step, in order (a decode step: 1, or up to k + 1 when speculating;
    a completed prompt: its first token), and the runner's finish after the last of them."""

    choices: list[TokenChoice] = field(default_factory=list)
    finish: str | None = None  # one of RUNNER_FINISHES, or None: the row goes on


@dataclass
class StepOutput:
    """What a step produced, by request id."""

    decoded: dict[int, RowOutput] = field(default_factory=dict)  # running rows' new tokens
    first: dict[int, RowOutput] = field(default_factory=dict)  # prompts completed: the first token
    fed: dict[int, int] = field(default_factory=dict)  # prompt tokens each prefilled request consumed
    joined: list[int] = field(default_factory=list)  # completed prompts now rows of the batch
    # recurrent states the prefill recorded at absolute prompt positions (prefix reuse):
    # {request id: {position: per layer its state (None for per-token layers)}}
    chunk_states: dict[int, dict[int, list[Any]]] = field(default_factory=dict)
    rows: dict[int, Any] = field(default_factory=dict)  # one-row caches of finished rows that live on
    # prompt scoring (``SamplingParams.prompt_logprobs``): per request, the chunk's scored positions
    prompt_logprobs: dict[int, list[float]] = field(default_factory=dict)
    prompt_top: dict[int, list[list[tuple[int, float]]]] = field(default_factory=dict)
