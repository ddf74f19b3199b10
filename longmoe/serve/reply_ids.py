"""Multi-turn reuse whatever the tokenizer makes of a reply: the ids each chat reply was generated as.

A chat's next turn reuses the previous request's end-of-request snapshot (prompt + reply ids) only if
the rendered conversation begins with exactly those ids. Re-encoding the reply's *text* gives them
only when the model happened to emit the tokenizer's own encoding: 40 generated newlines (or
spaces) re-encode as a few merged tokens, and the ``\\n`` of ``<|assistant|>\\n`` merges with a reply
that starts with whitespace. So each finished chat reply is kept as the ids it was generated as,
keyed by ``(cache salt, the prompt ids before it, its text)``; when a later turn renders that
assistant message after the same prompt ids, the kept ids go in place of re-encoding its text.

Only a faithful substitution is made: a reply is kept only when its ids decode to exactly the text
the client received (no stop-string cut, no tool call, no split character), and it is found only
by that exact text after those exact ids, so a message the client edited is re-encoded as usual.
The store is an LRU bounded in bytes (4 per id plus a fixed cost per entry); salts (one per API key,
as the prefix cache's ``cache_salt``) are part of the key, so one key never finds another's reply.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from longmoe.data.chat import ROLE_TOKENS, _content_text, render_message, with_tools

if TYPE_CHECKING:
    from longmoe.data.tokenizer import Tokenizer

ENTRY_BYTES = 96  # a key digest, the array header and the LRU links, per kept reply
ID_BYTES = 4  # ids kept as int32
DEFAULT_BUDGET_BYTES = 16 << 20  # ~4M reply tokens
HEAD = ROLE_TOKENS["assistant"] + "\n"


def _hasher(salt: bytes | None) -> Any:
    return hashlib.blake2b(salt or b"", digest_size=16, person=b"longmoe-reply")


def _ids_bytes(ids: Sequence[int]) -> bytes:
    return array("i", ids).tobytes()


def reply_key(salt: bytes | None, prompt_ids: Sequence[int], text: str) -> bytes:
    """The key of a reply: its text after exactly these prompt ids, under this salt."""
    h = _hasher(salt)
    h.update(_ids_bytes(prompt_ids))
    return _finish(h, text)


def _finish(h: Any, text: str) -> bytes:
    h = h.copy()
    h.update(b"\xff\xff\xff\xff")  # not an int32 id boundary a prompt could spell
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.digest()


class ReplyIds:
    """Kept reply ids, LRU under ``budget_bytes``; thread-safe (kept from the engine thread, found
    from the request's worker thread)."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._kept: OrderedDict[bytes, array] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.kept = self.found = self.evicted = self.refused = 0

    @staticmethod
    def cost(n_ids: int) -> int:
        return ENTRY_BYTES + ID_BYTES * n_ids

    def keep(
        self,
        tokenizer: Tokenizer,
        salt: bytes | None,
        prompt_ids: Sequence[int],
        text: str,
        ids: Sequence[int],
    ) -> bool:
        """Keep a finished reply's generated ``ids`` (ending in ``<|end|>`` or not) if they decode to
        exactly ``text``, the content the client got; returns whether it was kept."""
        body = list(ids[:-1]) if ids and ids[-1] == tokenizer.end_id else list(ids)
        if not body or "\ufffd" in text or tokenizer.decode(body, skip_special_tokens=False) != text:
            self.refused += 1
            return False
        need = self.cost(len(body))
        if need > self.budget_bytes:
            self.refused += 1
            return False
        key = reply_key(salt, prompt_ids, text)
        with self._lock:
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= self.cost(len(old))
            while self._kept and self._bytes + need > self.budget_bytes:
                _, gone = self._kept.popitem(last=False)
                self._bytes -= self.cost(len(gone))
                self.evicted += 1
            self._kept[key] = array("i", body)
            self._bytes += need
            self.kept += 1
        return True

    def find(self, key: bytes) -> list[int] | None:
        with self._lock:
            got = self._kept.get(key)
            if got is None:
                return None
            self._kept.move_to_end(key)
            self.found += 1
            return got.tolist()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "reply_ids_entries": len(self._kept),
                "reply_ids_bytes": self._bytes,
                "reply_ids_kept": self.kept,
                "reply_ids_found": self.found,
                "reply_ids_evicted": self.evicted,
                "reply_ids_refused": self.refused,
            }


def encode_chat_with_replies(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    bos: bool,
    replies: ReplyIds | None,
    salt: bytes | None,
) -> list[int]:
    """Prompt ids of a chat (ending in ``<|assistant|>\\n``), each earlier assistant reply found in
    ``replies`` rendered as its generated ids. Without a hit the ids equal
    ``tokenizer.encode(render_messages(messages, True, tools), bos)``: the text is only cut right
    before a role marker, a special token the tokenizer never merges across."""
    if not isinstance(messages, list):
        raise ValueError("messages must be a list of objects")
    messages = with_tools(messages, tools)
    ids: list[int] = [tokenizer.bos_id] if bos else []
    h = _hasher(salt)
    h.update(_ids_bytes(ids))
    pending: list[str] = []  # rendered text not encoded yet

    def commit(new: list[int]) -> None:
        ids.extend(new)
        h.update(_ids_bytes(new))

    for i, m in enumerate(messages):
        head, body, tail = render_message(m, i)
        if replies is not None and m.get("role") == "assistant" and not m.get("tool_calls"):
            commit(tokenizer.encode("".join(pending)) if pending else [])
            pending = []
            head_ids = tokenizer.encode(head)  # as the generation prompt ended the earlier request
            at = h.copy()
            at.update(_ids_bytes(head_ids))
            kept = replies.find(_finish(at, _content_text(m.get("content"), f"messages[{i}]")))
            if kept is not None:
                commit([*head_ids, *kept, tokenizer.end_id])
                pending = [tail]
                continue
        pending += [head, body, tail]
    pending.append(HEAD)
    commit(tokenizer.encode("".join(pending)))
    return ids
