"""The output processor (serve/output.py): a request's text outside the request record. Stop
strings cut the text wherever they fall across tokens and are never streamed; a stop token's text
is not shown; the runner's finishes (closed constraint, length) flush a trailing partial character;
the deltas concatenate to the final text."""

from __future__ import annotations

from longmoe.serve.output import OutputProcessor


def run(proc: OutputProcessor, ids: list[int], stop: list[str], finish_last: str | None = None):
    deltas, reason = [], None
    for i, t in enumerate(ids):
        reason, d = proc.process(0, t, stop, finish_last if i == len(ids) - 1 else None)
        deltas.append(d)
        if reason is not None:
            break
    return reason, deltas, proc.finish(0, reason or "length")


def test_stop_string_across_tokens_is_cut_and_never_streamed(tok):
    ids = tok.encode("hello world, said the cat", bos=False)
    text = tok.decode(ids)
    stop = "world,"
    reason, deltas, final = run(OutputProcessor(tok), ids, [stop])
    assert reason == "stop" and final == text[: text.find(stop)]
    assert "".join(deltas) == final and all(stop not in d for d in deltas)


def test_runner_finishes(tok):
    ids = tok.encode("one two", bos=False)
    text = tok.decode(ids)
    reason, deltas, final = run(OutputProcessor(tok), ids, [], finish_last="length")
    assert reason == "length" and final == text == "".join(deltas)
    reason, _, final = run(OutputProcessor(tok), ids, [], finish_last="complete")
    assert reason == "stop" and final == text
    reason, deltas, final = run(OutputProcessor(tok), [*ids, tok.eos_id], [], finish_last="stop_token")
    assert reason == "stop" and final == text  # the stop token adds no text


def test_without_a_tokenizer_there_is_no_text():
    reason, deltas, final = run(OutputProcessor(None), [5, 6, 7], ["x"], finish_last="length")
    assert reason == "length" and deltas == ["", "", ""] and final == ""
