"""Multi-turn reuse independent of re-encoding (``serve/reply_ids.py``): a chat reply whose text
re-encodes to other ids (40 generated spaces merge into a few tokens, and with the ``\\n`` of
``<|assistant|>\\n``) is rendered on the next turn as the ids it was generated as, so the whole reply
is reused; without a kept reply the ids are exactly the template's; the store is bounded, isolated
per salt, and never substitutes a text the client edited."""

from __future__ import annotations

import json

import httpx
import pytest

from longmoe.data.chat import render_messages
from longmoe.serve.reply_ids import ReplyIds, encode_chat_with_replies, reply_key
from tests.helpers.models import constant_reply_model
from tests.helpers.server import wait_idle

SPACES = " " * 40
TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {}}}


def chat(*turns: str) -> list[dict]:
    roles = ("user", "assistant")
    return [{"role": "system", "content": "Be brief."}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)
    ]


def space_ids(tok, n: int = 40) -> list[int]:
    return [tok.encode(" ")[0]] * n


@pytest.mark.parametrize(
    "messages",
    [chat("hi"), chat("hi", SPACES, "again"), chat("a\n\n", "\n  x", "b"), chat("q", "", "r")],
)
@pytest.mark.parametrize("tools", [None, [TOOL]])
def test_without_kept_replies_the_ids_are_the_templates(tok, messages, tools):
    want = tok.encode(render_messages(messages, True, tools), bos=True)
    assert encode_chat_with_replies(tok, messages, tools, True, ReplyIds(), None) == want
    assert encode_chat_with_replies(tok, messages, tools, True, None, None) == want


def test_a_kept_reply_is_rendered_as_its_generated_ids(tok):
    store = ReplyIds()
    prompt = encode_chat_with_replies(tok, chat("hi"), None, True, store, b"k")
    generated = space_ids(tok)
    assert tok.encode(render_messages(chat("hi", SPACES, "more"), True), bos=True)[: len(prompt) + 40] != [
        *prompt,
        *generated,
    ]  # re-encoding loses the reply: the case this module is for
    assert store.keep(tok, b"k", prompt, SPACES, generated)
    ids = encode_chat_with_replies(tok, chat("hi", SPACES, "more"), None, True, store, b"k")
    assert ids[: len(prompt) + 41] == [*prompt, *generated, tok.end_id]
    assert tok.decode(ids) == tok.decode(
        tok.encode(render_messages(chat("hi", SPACES, "more"), True), bos=True)
    )


def test_an_edited_reply_another_salt_or_another_prompt_is_not_substituted(tok):
    store = ReplyIds()
    prompt = encode_chat_with_replies(tok, chat("hi"), None, True, store, b"k")
    assert store.keep(tok, b"k", prompt, SPACES, space_ids(tok))
    plain = [
        (chat("hi", SPACES[:-1], "more"), b"k"),  # edited by the client
        (chat("hi", SPACES, "more"), b"other"),  # another key
        (chat("hi", SPACES, "more"), None),  # no key
        (chat("ho", SPACES, "more"), b"k"),  # another prompt before the same text
    ]
    for messages, salt in plain:
        want = tok.encode(render_messages(messages, True), bos=True)
        assert encode_chat_with_replies(tok, messages, None, True, store, salt) == want
    assert store.stats()["reply_ids_found"] == 0


def test_ids_that_do_not_decode_to_the_text_are_refused(tok):
    store = ReplyIds()
    end = [tok.end_id]
    assert not store.keep(tok, None, [1, 2], "not this", space_ids(tok))  # a stop string cut it
    assert not store.keep(tok, None, [1, 2], "", end)  # nothing to keep
    assert store.keep(tok, None, [1, 2], SPACES, space_ids(tok) + end)  # the closing <|end|> is not text
    assert store.find(reply_key(None, [1, 2], SPACES)) == space_ids(tok)
    assert store.stats()["reply_ids_refused"] == 2


def test_the_store_evicts_least_recently_used_replies_within_its_budget(tok):
    store = ReplyIds(budget_bytes=3 * ReplyIds.cost(40))
    for i in range(5):
        assert store.keep(tok, None, [i], SPACES, space_ids(tok))
        if i == 2:
            assert store.find(reply_key(None, [0], SPACES)) is not None  # 0 is now the most recent
    s = store.stats()
    assert s["reply_ids_entries"] == 3 and s["reply_ids_evicted"] == 2
    assert s["reply_ids_bytes"] <= store.budget_bytes
    kept = [i for i in range(5) if store.find(reply_key(None, [i], SPACES)) is not None]
    assert kept == [0, 3, 4]
    assert not ReplyIds(budget_bytes=10).keep(tok, None, [0], SPACES, space_ids(tok))  # larger than it all


@pytest.fixture(scope="module")
def space_server(make_engine, tok):
    """A tiny model that answers every chat with spaces (greedy), behind a real HTTP server."""
    from longmoe.serve.api.app import create_app
    from tests.helpers.server import serving

    with make_engine(
        constant_reply_model(tok.encode(" ")[0]), prefill_chunk=16, prefix_block_size=16
    ) as engine:
        app = create_app(engine, model_name="tiny")
        with serving(app) as url:
            yield engine, app, url


def turn(url: str, messages: list[dict], n: int = 40) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": n, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_reply_that_re_encodes_differently_is_fully_reused_next_turn(space_server):
    engine, app, url = space_server
    first = turn(url, chat("tell me about the garden, the river and the hills"))
    reply = first["choices"][0]["message"]["content"]
    assert reply == SPACES and first["choices"][0]["finish_reason"] == "length"
    wait_idle(engine)
    second = turn(url, chat("tell me about the garden, the river and the hills", reply, "and then?"))
    u1, u2 = first["usage"], second["usage"]
    # the previous prompt and every reply token but the last (decode never fed it) were not prefilled
    assert u2["prompt_tokens_details"]["cached_tokens"] == u1["prompt_tokens"] + u1["completion_tokens"] - 1
    assert app.state.server.replies.stats()["reply_ids_found"] >= 1
    wait_idle(engine)
    edited = turn(url, chat("tell me about the garden, the river and the hills", reply[:-2] + "x", "and?"))
    assert edited["usage"]["prompt_tokens_details"]["cached_tokens"] < u1["prompt_tokens"] + 16


def test_a_streamed_reply_is_kept_too(space_server):
    engine, _, url = space_server
    opening = "a streamed question about the mountains and the sea"
    body = {"model": "tiny", "messages": chat(opening), "max_tokens": 40, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    text, first = "", None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                j = json.loads(line[6:])
                first = j.get("usage") or first
                text += "".join(c["delta"].get("content") or "" for c in j["choices"])
    assert text == SPACES and first is not None
    wait_idle(engine)
    second = turn(url, chat(opening, text, "and?"))
    want = first["prompt_tokens"] + first["completion_tokens"] - 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == want
