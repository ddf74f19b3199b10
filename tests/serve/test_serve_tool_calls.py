"""Enforced tool calls in the engine (``serve/tool_calls.py``): a required call is always a valid call
of an allowed tool whatever the model's weights, a named one always names that tool, and ``none``
never opens a call; and the API's parsing of generated turns into ``tool_calls`` (whole and
streamed) on hand-built completions."""

from __future__ import annotations

import json

import pytest
import torch

from longmoe.data.chat import END, TOOL_CALL
from longmoe.serve.api.tools import ToolPlan, ToolStream, assistant_message
from longmoe.serve.engine import Engine
from longmoe.serve.request import Completion, Event
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.structured import JsonGrammars
from longmoe.serve.tool_calls import BannedTokens, ForcedCall, call_schema, forced_call, no_call
from tests.helpers.models import VOCAB
from tests.helpers.tokenizer import tokenizer_for_tests
from tests.serve.test_serve_structured import validate

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "maxLength": 8}},
            "required": ["query"],
        },
    },
}
PING = {"type": "function", "function": {"name": "ping"}}  # no parameters
TOOLS = [WEATHER, SEARCH, PING]
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(max_batch=64)


@pytest.fixture(scope="module")
def grammars(engine):
    return JsonGrammars(engine.tokenizer, engine.vocab_size)


def _call_of(engine: Engine, c: Completion) -> dict:
    """The one call a forced completion holds: <|tool_call|> first, then a JSON object."""
    tok = engine.tokenizer
    assert c.token_ids[0] == tok.token_to_id(TOOL_CALL) and c.finish_reason == "stop"
    return json.loads(tok.decode(c.token_ids[1:], skip_special_tokens=False).removesuffix(END))


def test_call_schema_shapes():
    one = call_schema(TOOLS, "search")
    assert one["properties"]["name"] == {"const": "search"} and one["required"] == ["name", "arguments"]
    assert one["properties"]["arguments"] == SEARCH["function"]["parameters"]
    assert [o["properties"]["name"]["const"] for o in call_schema(TOOLS)["anyOf"]] == [
        "get_weather",
        "search",
        "ping",
    ]
    assert call_schema([PING])["properties"]["arguments"] == {"type": "object", "properties": {}}
    with pytest.raises(ValueError, match="no tool named 'nope'"):
        call_schema(TOOLS, "nope")


def test_required_call_is_always_valid(engine, grammars):
    """60 sampled calls at temperature 1 from a random model, batched: each is <|tool_call|> then
    {"name": one of the tools, "arguments": matching that tool's schema}, and nothing after it."""
    tok = engine.tokenizer
    f = forced_call(grammars, tok.token_to_id(TOOL_CALL), TOOLS)
    prompt = engine.encode_chat([{"role": "user", "content": "weather?"}], TOOLS)
    params = [SamplingParams(max_tokens=300, temperature=1.0, seed=s, constraint=f) for s in range(60)]
    names = set()
    for c in engine.generate_batch([prompt] * 60, params):
        call = _call_of(engine, c)
        assert set(call) == {"name", "arguments"}
        validate(call["arguments"], SCHEMAS[call["name"]])
        names.add(call["name"])
    assert len(names) >= 2  # the grammar allows every tool, it does not pick one


def test_named_call_names_that_tool(engine, grammars):
    tok = engine.tokenizer
    f = forced_call(grammars, tok.token_to_id(TOOL_CALL), TOOLS, "get_weather")
    params = [SamplingParams(max_tokens=300, temperature=1.0, seed=s, constraint=f) for s in range(20)]
    for c in engine.generate_batch(["x"] * 20, params):
        call = _call_of(engine, c)
        assert call["name"] == "get_weather"
        validate(call["arguments"], SCHEMAS["get_weather"])


def test_forced_and_banned_masks():
    """ForcedCall leaves only the forced id (even if the model gave it -inf), then defers to the
    grammar; BannedTokens removes its ids; a wrong forced token is an error."""

    class Free:
        done = False

        def mask(self, logits):
            logits[0] = -1.0

        def accept(self, token):
            Free.done = True

    fc = ForcedCall([5], Free())
    x = torch.zeros(10)
    x[5] = float("-inf")
    fc.mask(x)
    assert torch.isfinite(x).nonzero().flatten().tolist() == [5]
    fc.accept(5)
    y = torch.zeros(10)
    fc.mask(y)
    assert y[0] == -1.0 and not fc.done
    fc.accept(3)
    assert fc.done
    with pytest.raises(RuntimeError, match="not the forced token"):
        ForcedCall([5], Free()).accept(4)
    b = BannedTokens([2, 7])
    z = torch.zeros(10)
    b.mask(z)
    assert torch.isinf(z).nonzero().flatten().tolist() == [2, 7] and not b.done


def test_none_never_opens_a_call(engine):
    """Sampled hot (temperature 1.5) under ``no_call``, the marker never appears."""
    call = engine.tokenizer.token_to_id(TOOL_CALL)
    f = no_call(call)
    params = [SamplingParams(max_tokens=20, temperature=1.5, seed=s, constraint=f) for s in range(8)]
    for c in engine.generate_batch(["x"] * 8, params):
        assert call not in c.token_ids


# ---------------------------------------------------------------- parsing generated turns (API)


def _completion(tok, text: str, finish: str = "stop") -> Completion:
    ids = tok.encode(text)
    plain = tok.decode(ids, skip_special_tokens=True)
    return Completion(plain, ids, finish, None, 3, len(ids))


PLAN = ToolPlan("auto", None, TOOLS)
S, P = '{"name": "search", "arguments": ', '{"name": "ping", "arguments": {}}'
CASES = [  # generated text, expected content, expected calls [(name, arguments)], finish
    (f'<|tool_call|>{S}{{"query": "kda"}}}}<|end|>', None, [("search", {"query": "kda"})], "tool_calls"),
    (f'Let me check.<|tool_call|>{P}<|tool_call|>{S}{{"query": "a"}}}}<|end|>',
     "Let me check.", [("ping", {}), ("search", {"query": "a"})], "tool_calls"),
    ("Paris is sunny.<|end|>", "Paris is sunny.", [], "stop"),
    (f'Hm<|tool_call|>{S}{{"query": <|end|>', f'Hm{S}{{"query": ', [], "stop"),
    (f'<|tool_call|>{P}<|tool_call|>{{"nam', f'{P}{{"nam', [], "length"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "content", "calls", "finish"), CASES)
def test_assistant_message_and_stream_agree(text, content, calls, finish):
    """Well-formed calls become tool_calls (content before them, null if empty); a malformed turn is
    plain content without markers; streaming token by token gives the same message."""
    tok = tokenizer_for_tests(VOCAB)
    c = _completion(tok, text, "length" if finish == "length" else "stop")
    msg, fin = assistant_message(tok, c, PLAN)
    assert fin == finish and msg["content"] == content
    got = [
        (tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in msg.get("tool_calls", [])
    ]
    assert got == calls
    assert all(tc["id"].startswith("call_") and tc["type"] == "function" for tc in msg.get("tool_calls", []))

    chunks = []
    stream = ToolStream(tok, PLAN, lambda d, f: {"delta": d, "finish": f})
    pieces = [tok.decode([i], skip_special_tokens=True) for i in c.token_ids]
    for k, i in enumerate(c.token_ids):
        done = c if k == len(c.token_ids) - 1 else None
        chunks += stream(Event(pieces[k] if done is None else "", [i], None, done))
    streamed = "".join(ch["delta"].get("content", "") for ch in chunks)
    assert streamed == (content or "") and "<|" not in streamed
    deltas = [ch["delta"]["tool_calls"][0] for ch in chunks if "tool_calls" in ch["delta"]]
    assert [d["index"] for d in deltas] == list(range(len(calls)))
    assert [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == calls
    assert [ch["finish"] for ch in chunks if ch["finish"]] == [finish]


def test_parallel_false_keeps_the_first_call():
    tok = tokenizer_for_tests(VOCAB)
    c = _completion(tok, CASES[1][0])
    msg, fin = assistant_message(tok, c, ToolPlan("auto", None, TOOLS, parallel=False))
    assert [tc["function"]["name"] for tc in msg["tool_calls"]] == ["ping"] and fin == "tool_calls"


def test_without_tools_nothing_is_parsed():
    """No tools (or tool_choice none): the text is returned as before, special tokens dropped."""
    tok = tokenizer_for_tests(VOCAB)
    c = _completion(tok, CASES[0][0])
    msg, fin = assistant_message(tok, c, ToolPlan("none", None, TOOLS))
    assert msg == {"role": "assistant", "content": c.text} and fin == "stop"
