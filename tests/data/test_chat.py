"""The chat + tool-call format: rendering, the SFT loss mask, and parsing what a model wrote."""

from __future__ import annotations

import pytest

from longmoe.data.chat import (
    TOOLS_HEADER,
    ToolCall,
    encode_chat,
    parse_assistant,
    render_messages,
    render_tools,
    with_tools,
)
from tests.helpers.tokenizer import tokenizer_for_tests

MESSAGES = [
    {"role": "system", "content": "You can search."},
    {"role": "user", "content": "Who wrote doc 7?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "open", "arguments": '{"doc": 7}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "Doc 7 was written by Ada."},
    {"role": "assistant", "content": "Ada."},
]


def test_chat_template() -> None:
    """The template renders roles, tool calls and results, and the generation prompt."""
    tok = tokenizer_for_tests()
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "calc", "arguments": '{"x": "2+2"}'}}],
        },
        {"role": "tool", "content": "4"},
    ]
    s = render_messages(msgs)
    assert s == (
        "<|system|>\nbe brief<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>\n"
        '<|tool_call|>{"name": "calc", "arguments": {"x": "2+2"}}<|end|>\n'
        "<|tool_result|>\n4<|end|>\n<|assistant|>\n"
    )
    ids = tok.encode(s)
    assert ids[0] == tok.system_id and ids[-2:-1] == [tok.assistant_id] or ids[-1] == tok.assistant_id
    assert tok.decode(ids) == s


def test_render_format() -> None:
    """Calls are JSON inside <|tool_call|> and close with the turn's single <|end|>."""
    s = render_messages(MESSAGES, add_generation_prompt=False)
    assert s == (
        "<|system|>\nYou can search.<|end|>\n<|user|>\nWho wrote doc 7?<|end|>\n"
        '<|assistant|>\nLet me look.<|tool_call|>{"name": "open", "arguments": {"doc": 7}}<|end|>\n'
        "<|tool_result|>\nDoc 7 was written by Ada.<|end|>\n<|assistant|>\nAda.<|end|>\n"
    )


def test_mask_marks_exactly_the_assistant_bodies() -> None:
    """encode_chat's ids equal encoding the whole text; the mask covers assistant bodies + <|end|>."""
    tok = tokenizer_for_tests()
    ct = encode_chat(tok, MESSAGES)
    assert ct.ids == tok.encode(render_messages(MESSAGES, add_generation_prompt=False))
    trained = [i for i, m in zip(ct.ids, ct.assistant_mask, strict=True) if m]
    expect = tok.encode('Let me look.<|tool_call|>{"name": "open", "arguments": {"doc": 7}}<|end|>')
    expect += tok.encode("Ada.<|end|>")
    assert trained == expect
    assert (
        tok.user_id not in trained and tok.assistant_id not in trained and tok.tool_result_id not in trained
    )
    gen = encode_chat(tok, MESSAGES[:2], add_generation_prompt=True, bos=True)
    assert gen.ids[0] == tok.bos_id and gen.ids[-2] == tok.assistant_id and not any(gen.assistant_mask)


def test_parse_round_trip() -> None:
    """What the template writes for an assistant turn parses back to the same content and calls."""
    call = ToolCall("search", {"query": "Ada", "k": 3})
    text = "thinking<|tool_call|>" + call.to_json() + "<|tool_call|>" + ToolCall("open", {"doc": 1}).to_json()
    turn = parse_assistant(text + "<|end|>ignored")
    assert turn.malformed is None and turn.content == "thinking"
    assert turn.tool_calls == (call, ToolCall("open", {"doc": 1}))
    assert not turn.is_final
    assert parse_assistant("42<|end|>").is_final
    entry = call.to_openai("call_0")
    assert (
        entry["function"]["name"] == "search" and entry["function"]["arguments"] == '{"query": "Ada", "k": 3}'
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("<|tool_call|>{not json", "invalid JSON"),
        ('<|tool_call|>["search"]', "string 'name'"),
        ('<|tool_call|>{"name": "", "arguments": {}}', "string 'name'"),
        ('<|tool_call|>{"name": "f", "arguments": "x"}', "must be a JSON object"),
        ('<|tool_call|>{"name": "f", "arguments": {}, "extra": 1}', "unexpected keys"),
    ],
)
def test_parse_malformed(text: str, why: str) -> None:
    """A call that does not parse makes the turn malformed, never final, with the reason."""
    turn = parse_assistant(text)
    assert turn.malformed is not None and why in turn.malformed and not turn.is_final


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([{"role": "robot", "content": "x"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
        (
            [{"role": "user", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}],
            "messages[0].tool_calls",
        ),
        ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}], "function.name"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}],
            "arguments",
        ),
        ("hello", "messages must be a list"),
    ],
)
def test_bad_messages_name_the_field(messages, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        render_messages(messages)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "open",
            "description": "Open a document.",
            "parameters": {"type": "object", "properties": {"doc": {"type": "integer"}}, "required": ["doc"]},
        },
    },
    {"name": "done"},  # a bare function object, no parameters
]


def test_render_tools_is_one_line_per_tool() -> None:
    """The block is the header, then ``- name(arg: type, ...): description`` per tool, in order;
    a tool without parameters or description, and untyped or multi-typed parameters, still render."""
    odd = {
        "name": "find",
        "parameters": {"type": "object", "properties": {"q": {}, "n": {"type": ["integer", "null"]}}},
    }
    assert render_tools([*TOOLS, odd]).split("\n") == [
        TOOLS_HEADER,
        "- open(doc: integer): Open a document.",
        "- done()",
        "- find(q: any, n: integer|null)",
    ]
    s = render_tools(TOOLS)
    assert "<|" not in s and render_tools(TOOLS) == s  # no special-token text; pure


def test_tools_join_the_system_message() -> None:
    """Tools extend the first system message after a blank line, or become one; rendering and
    encoding with tools= equal doing it by hand, and the mask stays exact."""
    merged = with_tools(MESSAGES, TOOLS)
    assert merged[0] == {"role": "system", "content": "You can search.\n\n" + render_tools(TOOLS)}
    assert merged[1:] == MESSAGES[1:] and MESSAGES[0]["content"] == "You can search."
    bare = with_tools(MESSAGES[1:], TOOLS)
    assert bare[0] == {"role": "system", "content": render_tools(TOOLS)} and bare[1:] == MESSAGES[1:]
    assert with_tools(MESSAGES, None) is MESSAGES and with_tools(MESSAGES, []) is MESSAGES
    s = render_messages(MESSAGES, tools=TOOLS)
    assert s == render_messages(merged)
    tok = tokenizer_for_tests()
    ct = encode_chat(tok, MESSAGES, tools=TOOLS)
    assert ct.ids == tok.encode(render_messages(merged, add_generation_prompt=False))


def test_render_tools_names_a_bad_tool() -> None:
    with pytest.raises(ValueError, match=r"tools\[1\]\.function\.name"):
        render_tools([TOOLS[0], {"type": "function", "function": {"description": "no name"}}])


def test_with_tools_is_idempotent() -> None:
    """A system message that already ends with the tools block is left as it is (no second copy)."""
    once = with_tools(MESSAGES, TOOLS)
    assert with_tools(once, TOOLS) == once
    assert render_messages(once, tools=TOOLS) == render_messages(once)


def test_image_parts_become_their_spans_in_order() -> None:
    """Each image part is replaced by its image's span (<|image|> + rows*cols patches + <|/image|>) where
    the part stands; text around it is unchanged; counts that do not match are errors."""
    import torch

    from longmoe.types import Patches

    tok = tokenizer_for_tests()
    a, b = Patches(torch.zeros(6, 48), 2, 3), Patches(torch.zeros(1, 48), 1, 1)
    img = {"type": "image_url", "image_url": {"url": "data:,"}}
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "left "}, img, {"type": "text", "text": " mid"}],
        },
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [img]},
    ]
    ct = encode_chat(tok, msgs, images=[a, b])
    plain = encode_chat(tok, msgs).ids  # without images: the two-token IMAGE_SPAN placeholders
    s, p, e = tok.image_start_id, tok.image_patch_id, tok.image_end_id
    i = plain.index(s)
    assert ct.ids[: i + 8] == plain[:i] + [s] + [p] * 6 + [e]
    j = len(plain) - 1 - plain[::-1].index(s)
    assert ct.ids[j + 6 :] == [s, p, e] + plain[j + 2 :]  # the first span grew by 6 patches
    assert len(ct.ids) == len(plain) + 7 and len(ct.assistant_mask) == len(ct.ids)
    with pytest.raises(ValueError, match="different number of image parts"):
        encode_chat(tok, msgs, images=[a])
    with pytest.raises(ValueError, match="different number of image parts"):
        encode_chat(tok, msgs, images=[a, b, b])
    spelled = [{"role": "user", "content": [{"type": "text", "text": "<|image|><|/image|>"}, img]}]
    with pytest.raises(ValueError, match="different number of image parts"):
        encode_chat(tok, spelled, images=[a])
