"""Multi-hop document lookup: follow registry notes across a generated library to an access code.

A task's library has ``horizon`` chain documents plus ``distractors`` others; each document is a
record (titled like ``amber-falcon``, id like ``D4821``) of ``pages_per_doc`` pages of real prose
filler (docstrings of the standard library, as the long-context tasks use) of ``page_chars``
characters, and one page carries the document's registry note: either ``the record X refers onward
to the record Y`` or ``the record X holds the access code 482913``. The question names the first
record; the answer is the code at the end of its chain. Distractor titles share words with chain
titles (so a search returns several candidates) and form a decoy chain ending in another code.

Tools: ``search(query)`` ranks documents by the words their title shares with the query (the exact
title first) and lists ``id title (n pages; registry note on page p)``; ``open(doc_id, page)``
returns that page. One hop = one search + one open, so the expert makes ``2 * horizon`` calls and a
trajectory holds ``horizon`` pages: ``page_chars`` sets how long it gets (many thousands of tokens
for long pages and hops, a few hundred for tiny-model training).

Answer: the final turn's content, stripped of whitespace, quotes and one trailing period, must equal
the code (six digits). The knowledge state is which chain documents the agent has located (seen in
search results) and which chain notes it has read.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from longmoe.data.chat import AssistantTurn, ToolCall
from longmoe.envs.base import EnvConfigError
from longmoe.envs.sql_sandbox import truncate
from longmoe.envs.toolenv import ToolEnv, ToolError, check_range, function_schema
from longmoe.tasks.base import ADJECTIVES, NOUNS, distinct, filler_text, key_name

MAX_HORIZON = 32
_REFER = "Registry note: the record {a} refers onward to the record {b}."
_HOLD = "Registry note: the record {a} holds the access code {code}."
_REV1, _REV2 = "Registry note (revision 1):", "Registry note (revision 2, supersedes revision 1):"
_NOTE_ROOM = 200  # characters kept free after the note in a capped page (header, truncation note)
_CORRECTED = (
    " A record may have two documents: when their notes disagree, the note of the higher revision holds."
)
_WORDS = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class DocLookupConfig:
    """``horizon``: documents to follow (hops), 1..32; ``page_chars``: prose characters per page
    (40..200000); ``pages_per_doc``: 1..64; ``distractors``: documents off the chain (0..256);
    ``max_results``: search hits listed (1..100); ``max_turns``: assistant turns before the episode
    is cut (0: ``4 * horizon + 4``); ``corrections``: chain records that also have a later
    revision-2 note in a second document of the same title, superseding a revision-1 note that points
    into the decoy chain (0..horizon; needs distractors); ``max_result_chars``: an ``open`` result
    longer than this is cut with a stated note (0: no cap, else >= 400; the registry note always
    sits inside the cap, so only prose is cut)."""

    horizon: int = 2
    page_chars: int = 600
    pages_per_doc: int = 2
    distractors: int = 4
    max_results: int = 5
    max_turns: int = 0
    corrections: int = 0
    max_result_chars: int = 0

    def __post_init__(self) -> None:
        check_range("horizon", self.horizon, 1, MAX_HORIZON)
        check_range("page_chars", self.page_chars, 40, 200_000)
        check_range("pages_per_doc", self.pages_per_doc, 1, 64)
        check_range("distractors", self.distractors, 0, 256)
        check_range("max_results", self.max_results, 1, 100)
        check_range("max_turns", self.max_turns, 0, 10_000)
        check_range("corrections", self.corrections, 0, self.horizon)
        if self.corrections and not self.distractors:
            raise EnvConfigError(
                f"corrections={self.corrections} needs distractors >= 1: a superseded note points into them"
            )
        if self.max_result_chars:
            check_range("max_result_chars", self.max_result_chars, 400, 10_000_000)


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    note: str
    note_page: int  # 1-based


def _similar_title(rng: random.Random, title: str) -> str:
    """A title sharing one word with ``title`` (so searching for it also finds this one)."""
    adj, noun = title.split("-")
    return f"{adj}-{rng.choice(NOUNS)}" if rng.random() < 0.5 else f"{rng.choice(ADJECTIVES)}-{noun}"


def _page_text(rng: random.Random, n_chars: int, note: str | None, within: int = 0) -> str:
    """``n_chars`` of filler prose cut at a word boundary, with ``note`` between two sentences
    (ending within the first ``within`` characters when that is set)."""
    text = filler_text(rng, n_chars).replace("\n", " ")[:n_chars]
    text = text.rsplit(" ", 1)[0] if len(text) == n_chars and " " in text else text
    if note is None:
        return text
    sentences = re.split(r"(?<=[.!?])\s+", text)
    at = rng.randint(0, len(sentences))
    if within:
        while at and len(" ".join(sentences[:at])) + len(note) + 1 > within:
            at -= 1
    return " ".join(sentences[:at] + [note] + sentences[at:]).strip()


class DocLookupEnv(ToolEnv):
    """Follow a chain of registry notes through a library with ``search`` and ``open``."""

    name = "doclookup"
    tools = [
        function_schema(
            "search",
            "Search the library's document titles; lists matching documents, best first.",
            {"query": ("string", "words of the title to look for, e.g. 'amber-falcon'")},
        ),
        function_schema(
            "open",
            "Read one page of a document.",
            {
                "doc_id": ("string", "the document id from a search result, e.g. 'D4821'"),
                "page": ("integer", "the page number, from 1"),
            },
        ),
    ]
    instructions = (
        "You answer questions about a library of documents. Each document is a record with one "
        "registry note. Use the tools to find and read documents; follow the notes from record to "
        "record. When you know the answer, reply with it only."
    )

    def __init__(self, config: DocLookupConfig | None = None) -> None:
        self.config = config or DocLookupConfig()
        c = self.config
        super().__init__(c.horizon, c.max_turns or 4 * c.horizon + 4 + 2 * c.corrections)
        if c.corrections:
            self.instructions = DocLookupEnv.instructions + _CORRECTED

    # ------------------------------------------------------------------ task
    def _key(self, seed: int) -> str:
        c = self.config
        extra = f":c{c.corrections}" if c.corrections else ""  # tasks without corrections as before
        shape = f"{c.horizon}:{c.page_chars}:{c.pages_per_doc}:{c.distractors}{extra}"
        return f"longmoe-env:doclookup:{shape}:{seed}"

    def _draw(self, seed: int) -> str:
        c = self.config
        rng = random.Random(self._key(seed))
        # chain titles share no word, so a search for one never lists another chain document
        adjs, nouns = rng.sample(ADJECTIVES, c.horizon), rng.sample(NOUNS, c.horizon)
        chain = [f"{a}-{n}" for a, n in zip(adjs, nouns)]
        titles = list(chain)
        while len(titles) < c.horizon + c.distractors:  # most near a chain title; all distinct
            near = rng.random() < 0.7
            t = _similar_title(rng, rng.choice(chain)) if near else key_name(rng)
            if t not in titles:
                titles.append(t)
        ids = distinct(rng, len(titles), lambda r: f"D{r.randrange(1000, 10000)}")
        codes = distinct(rng, 2, lambda r: str(r.randrange(100_000, 1_000_000)))
        self.code = codes[0]
        decoy = titles[c.horizon :]
        notes = [_REFER.format(a=a, b=b) for a, b in zip(chain, chain[1:])]
        notes.append(_HOLD.format(a=chain[-1], code=codes[0]))
        if decoy:
            notes += [_REFER.format(a=a, b=b) for a, b in zip(decoy, decoy[1:])]
            notes.append(_HOLD.format(a=decoy[-1], code=codes[1]))
        self.docs = [
            Document(i, t, n, rng.randint(1, c.pages_per_doc))
            for i, t, n in zip(ids, titles, notes, strict=True)
        ]
        self._add_corrections(rng, chain, decoy, codes[1])
        self.by_id = {d.doc_id: d for d in self.docs}
        self.located: set[int] = set()  # chain positions whose document id the agent has seen
        self.read: set[int] = set()  # documents (chain positions, then errata) whose note was read
        self._pages: dict[tuple[str, int], str] = {}
        return (
            f"Start from the record {chain[0]}. Its registry note either refers onward to another "
            "record or holds an access code; follow the references until you reach an access code. "
            "What is that access code? Reply with the code only."
        )

    def _add_corrections(self, rng: random.Random, chain: list[str], decoy: list[str], wrong: str) -> None:
        """``corrections`` chain records get a second document of the same title whose revision-2
        note holds; the first document's note becomes revision 1 and points into the decoy chain."""
        c, h = self.config, self.horizon
        self.errata: dict[int, int] = {}  # chain position -> index of its erratum in self.docs
        used = {d.doc_id for d in self.docs}
        for i in sorted(rng.sample(range(h), c.corrections)):
            doc = self.docs[i]
            true = doc.note.removeprefix("Registry note: ")
            bad = (
                f"the record {chain[i]} holds the access code {wrong}."
                if i == h - 1
                else f"the record {chain[i]} refers onward to the record {decoy[0]}."
            )
            self.docs[i] = Document(doc.doc_id, doc.title, f"{_REV1} {bad}", doc.note_page)
            new_id = next(d for d in iter(lambda: f"D{rng.randrange(1000, 10000)}", None) if d not in used)
            used.add(new_id)
            self.errata[i] = len(self.docs)
            self.docs.append(Document(new_id, doc.title, f"{_REV2} {true}", rng.randint(1, c.pages_per_doc)))

    def _docs_of(self, i: int) -> list[int]:
        """The indices of chain position ``i``'s documents (its erratum too), in search-listing order."""
        mine = [i] + ([self.errata[i]] if i in self.errata else [])
        return sorted(mine, key=lambda j: self.docs[j].doc_id)

    @property
    def answer(self) -> str:
        return self.code

    def page(self, doc: Document, page: int) -> str:
        """The text of ``page`` (1-based) of ``doc``: a pure function of the seed and the config."""
        key = (doc.doc_id, page)
        if key not in self._pages:
            rng = random.Random(f"{self._key(self.seed or 0)}:{doc.doc_id}:{page}")
            note = doc.note if page == doc.note_page else None
            cap = self.config.max_result_chars
            self._pages[key] = _page_text(
                rng, self.config.page_chars, note, max(1, cap - _NOTE_ROOM) if cap else 0
            )
        return self._pages[key]

    # ------------------------------------------------------------------ tools
    def search(self, query: str) -> list[Document]:
        words = set(_WORDS.findall(query.lower()))
        scored = []
        for d in self.docs:
            score = len(words & set(d.title.split("-"))) + 3 * (d.doc_id.lower() in words)
            if score:
                scored.append((-score, d.doc_id, d))
        return [d for *_, d in sorted(scored)[: self.config.max_results]]

    def _run(self, name: str, arguments: dict[str, Any]) -> str:
        h = self.horizon
        if name == "search":
            hits = self.search(arguments["query"])
            self.located |= {i for i in range(h) if self.docs[i] in hits}
            if not hits:
                return f"No document title matches {arguments['query']!r}."
            n = self.config.pages_per_doc
            return "\n".join(
                f"{d.doc_id} {d.title} ({n} pages; registry note on page {d.note_page})" for d in hits
            )
        doc = self.by_id.get(arguments["doc_id"].strip().upper())
        if doc is None:
            raise ToolError(f"there is no document {arguments['doc_id']!r}; search for its title first")
        page, n = arguments["page"], self.config.pages_per_doc
        if not 1 <= page <= n:
            raise ToolError(f"page {page} does not exist: {doc.doc_id} has pages 1 to {n}")
        i = self.docs.index(doc)
        if (i < h or i in self.errata.values()) and page == doc.note_page:
            self.read.add(i)
        text = f"[{doc.doc_id} {doc.title}, page {page} of {n}]\n{self.page(doc, page)}"
        return truncate(text, self.config.max_result_chars)

    # ------------------------------------------------------------------ knowledge, expert
    def state_key(self) -> str:
        return f"doclookup:{self.seed}:located={sorted(self.located)}:read={sorted(self.read)}"

    def expert(self) -> AssistantTurn:
        # a hop is done once every document of its record is read (the erratum's and the original's)
        k = next((i for i in range(self.horizon) if not set(self._docs_of(i)) <= self.read), None)
        if k is None:
            return AssistantTurn(self.code)
        if k not in self.located:
            return AssistantTurn("", (ToolCall("search", {"query": self.docs[k].title}),))
        doc = self.docs[next(j for j in self._docs_of(k) if j not in self.read)]
        return AssistantTurn("", (ToolCall("open", {"doc_id": doc.doc_id, "page": doc.note_page}),))
