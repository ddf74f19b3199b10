"""``longmoe chat``: Ctrl-C stops the reply being generated (or clears the prompt) and the session goes
on with its history intact; no traceback, exit status 0 at the end."""

from __future__ import annotations

import sys

import pytest

from longmoe.cli import main
from longmoe.serve.engine import Engine, RequestHandle
from longmoe.serve.sampling import SamplingParams

CTRL_C = object()  # a stdin "line" that is a Ctrl-C instead
ARGS = ["--temperature", "0", "--max-tokens", "8"]


class Keyboard:
    """stdin typed by a user: the given lines in order; ``CTRL_C`` raises KeyboardInterrupt in readline."""

    def __init__(self, *lines: object) -> None:
        self.lines = list(lines)

    def isatty(self) -> bool:
        return False

    def readline(self) -> str:
        if not self.lines:
            return ""  # Ctrl-D
        line = self.lines.pop(0)
        if line is CTRL_C:
            raise KeyboardInterrupt
        return line


@pytest.fixture(scope="module")
def first_reply(model_dir) -> str:
    """The greedy reply to a fresh conversation's "hello"."""
    with Engine.from_dir(model_dir) as e:
        ids = e.encode_chat([{"role": "user", "content": "hello"}])
        return e.generate(ids, SamplingParams(max_tokens=8, temperature=0.0)).text


def test_ctrl_c_at_the_prompt_keeps_the_session(model_dir, first_reply, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", Keyboard(CTRL_C, "hello\n", CTRL_C, "/exit\n"))
    assert main(["chat", "--model", str(model_dir), *ARGS]) == 0
    out, err = capsys.readouterr()
    assert f"assistant> {first_reply}\n" in out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_ctrl_c_while_generating_drops_that_turn_only(model_dir, first_reply, capsys, monkeypatch):
    events, cancelled = RequestHandle.events, []

    def interrupted_once(self, *a, **k):  # the first reply is interrupted after its first event
        for i, ev in enumerate(events(self, *a, **k)):
            if i == 1 and not cancelled:
                cancelled.append(self)
                raise KeyboardInterrupt
            yield ev

    monkeypatch.setattr(RequestHandle, "events", interrupted_once)
    cancel, cancel_calls = RequestHandle.cancel, []
    monkeypatch.setattr(RequestHandle, "cancel", lambda self: (cancel_calls.append(self), cancel(self)))
    monkeypatch.setattr(sys, "stdin", Keyboard("hello\n", "hello\n"))
    assert main(["chat", "--model", str(model_dir), *ARGS]) == 0
    out, err = capsys.readouterr()
    assert len(cancelled) == 1 and cancel_calls == cancelled and "[interrupted]" in out
    # the interrupted turn left no trace in the history: the next "hello" is a fresh first turn
    assert out.count(f"assistant> {first_reply}\n") == 1
    assert "Traceback" not in err
