"""``longmoe chat``: Ctrl-C stops the reply being generated (or clears the prompt) and the session goes
on with its history intact; no traceback, exit status 0 at the end."""

from __future__ import annotations

import json
import sys

import pytest

from longmoe.cli import main
from longmoe.serve.engine import RequestHandle
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
def first_reply(make_engine) -> str:
    """The greedy reply to a fresh conversation's "hello"."""
    with make_engine() as e:
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


def test_tools_file_shows_calls_and_reads_results(model_dir, tmp_path, capsys, monkeypatch):
    """--tools with --tool-choice required: the first turn is a call shown as ``-> name({...})``, the
    next line is its result, and the model then answers (free) in text."""
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"k": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["k"]}}}]  # fmt: skip
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    monkeypatch.setattr(sys, "stdin", Keyboard("find it\n", "42\n", "/exit\n"))
    argv = ["chat", "--model", str(model_dir), *ARGS, "--max-tokens", "80", "--tools", str(path)]
    argv += ["--tool-choice", "required"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith("  -> lookup("))
    args = json.loads(lines[i].removeprefix("  -> lookup(").removesuffix(")"))
    assert set(args) == {"k"} and 0 <= args["k"] <= 9
    assert lines[i - 1] == "assistant> " and lines[i + 1].startswith("assistant> ")
    assert "<|" not in out and "Traceback" not in err


def test_bad_tools_file_is_an_error(model_dir, tmp_path, capsys):
    path = tmp_path / "tools.json"
    path.write_text('{"name": "not a list"}')
    assert main(["chat", "--model", str(model_dir), "--tools", str(path)]) == 2
    assert "expected a JSON list of function schemas" in capsys.readouterr().err
