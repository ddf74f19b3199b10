"""Multi-turn prefix reuse matches on token ids: a chat's next turn (the conversation so far, the
model's reply, a new message) must begin with exactly the previous prompt's ids + the generated ids,
for the end-of-request snapshot to cover the whole reply. Checked for replies the model produces in
the tokenizer's own (canonical) encoding: plain, multi-byte text and tool calls."""

from __future__ import annotations

import json

import pytest

from longmoe.data.chat import render_message, render_messages

CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "lookup", "arguments": json.dumps({"q": "é"})},
}


@pytest.mark.parametrize(
    "reply",
    [
        {"role": "assistant", "content": "Sure, here it is."},
        {"role": "assistant", "content": "Grüße aus 東京 🙂 — ça va?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
    ],
)
def test_the_next_turn_starts_with_the_previous_prompt_and_reply_ids(tok, reply):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 日本\nnew line"}]
    prompt = tok.encode(render_messages(msgs, add_generation_prompt=True), bos=True)
    _, body, _ = render_message(reply)
    generated = tok.encode(body)  # what the model emits after <|assistant|>\n, ending in <|end|>
    assert generated[-1] == tok.end_id
    nxt = (
        [{"role": "tool", "content": "42"}]
        if reply.get("tool_calls")
        else [{"role": "user", "content": "ok"}]
    )
    ids = tok.encode(render_messages([*msgs, reply, *nxt], add_generation_prompt=True), bos=True)
    assert ids[: len(prompt) + len(generated)] == prompt + generated
