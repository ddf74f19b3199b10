"""OpenAI function calling over HTTP with the official ``openai`` client: tools -> tool_calls -> the
tool's result as a ``tool`` message -> a final answer, whole and streamed; tools reach the prompt;
bad ``tools`` / ``tool_choice`` are 400s naming the field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.helpers.server import served
from tests.serve.test_serve_structured import validate
from tests.serve.test_serve_tool_calls import SCHEMAS, TOOLS, WEATHER

ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def server(model_dir):
    with served(model_dir, prefill_chunk=16) as (engine, app, url):
        yield engine, url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="x", max_retries=0, timeout=120)


def _streamed(chunks) -> tuple[str, dict[int, dict], str | None]:
    """Accumulate a stream as a client does: content, tool calls by index, the finish reason."""
    text, calls, finish = "", {}, None
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        text += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = tc.id or c["id"]
            c["name"] += tc.function.name or ""
            c["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return text, calls, finish


def test_function_calling_flow(client):
    """Named tool_choice forces a valid call; its result goes back as a tool message; the second
    request (tool_choice none) answers in text."""
    r = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice=NAMED, max_tokens=200, seed=1
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    validate(args, SCHEMAS["get_weather"])
    messages = [
        *ASK,
        choice.message,  # the response's message object, sent back as it is
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 3, "sky": "snow"})},
    ]
    r2 = client.chat.completions.create(
        model="tiny", messages=messages, tools=TOOLS, tool_choice="none", max_tokens=12, seed=1
    )
    final = r2.choices[0]
    assert final.finish_reason in ("stop", "length") and final.message.tool_calls is None
    assert isinstance(final.message.content, str) and "<|" not in final.message.content
    assert r2.usage.prompt_tokens > r.usage.prompt_tokens  # the call and its result are in the prompt


def test_openai_style_assistant_message_is_accepted(server):
    """An assistant message as OpenAI returns it (refusal, annotations) can be sent back."""
    call = {"id": "call_1", "type": "function", "function": {"name": "ping", "arguments": "{}"}}
    msg = {"role": "assistant", "content": None, "refusal": None, "annotations": [], "tool_calls": [call]}
    result = {"role": "tool", "tool_call_id": "call_1", "content": "pong"}
    body = {"model": "tiny", "messages": [*ASK, msg, result], "tools": TOOLS, "max_tokens": 2}
    r = httpx.post(server[1] + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text


def test_streamed_flow_matches_whole(client):
    """The same seeded request streamed: one tool_calls delta per call with id, name and arguments,
    finish tool_calls, equal to the whole response (but for the call ids); no content leaks."""
    kw = dict(model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=200, seed=5)
    whole = client.chat.completions.create(**kw).choices[0]
    text, calls, finish = _streamed(client.chat.completions.create(**kw, stream=True))
    assert finish == whole.finish_reason == "tool_calls" and text == (whole.message.content or "")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (tc.function.name, tc.function.arguments) for tc in whole.message.tool_calls
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()]},
        *[{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls.values()],
    ]  # fmt: skip
    text2, calls2, finish2 = _streamed(
        client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, tool_choice="none",
                                       max_tokens=12, seed=5, stream=True)
    )  # fmt: skip
    assert calls2 == {} and finish2 in ("stop", "length") and "<|" not in text2


def test_required_over_many_seeds(client):
    """A random tiny model, sampled hot: every required call is a valid call of one of the tools."""
    for seed in range(12):
        r = client.chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300,
            temperature=1.0, seed=seed,
        )  # fmt: skip
        (tc,) = r.choices[0].message.tool_calls
        validate(json.loads(tc.function.arguments), SCHEMAS[tc.function.name])


def test_auto_returns_text_or_calls(client):
    """auto decodes freely: a random model writes text, returned as content with its own finish."""
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=16, seed=0)
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
    else:
        assert c.finish_reason in ("stop", "length") and "<|" not in (c.message.content or "")


def test_tools_are_in_the_prompt(server, client):
    """The prompt is the messages with render_tools' block as the system message."""
    engine, _ = server
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, max_tokens=1)
    assert r.usage.prompt_tokens == len(engine.encode_chat(ASK, TOOLS))
    r0 = client.chat.completions.create(model="tiny", messages=ASK, max_tokens=1)
    assert r0.usage.prompt_tokens == len(engine.encode_chat(ASK)) < r.usage.prompt_tokens


BAD = [
    ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name", "duplicate function name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name", "pattern"),
    ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, "tools.0.type", "function"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters", "type 'object'"),
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when tools are given"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", ""),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "no tool named 'nope'"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice", "cannot be combined"),
    ({"messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages.1.tool_call_id", "required"),
    ({"tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object",
      "properties": {"x": {"type": "nonsense"}}}}}], "tool_choice": "required"}, "tools", "does not compile"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "param", "message"), BAD)
def test_bad_tools_are_400s_naming_the_field(server, extra, param, message):
    body = {"model": "tiny", "messages": ASK, "max_tokens": 4, **extra}
    r = httpx.post(server[1] + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and message in err["message"], err
