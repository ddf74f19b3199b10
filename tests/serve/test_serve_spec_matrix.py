"""Speculative decoding composes: greedy output equals plain decoding in every combination of
``k`` x prefix hit (none / partial / full) x a session's second turn x chunked prefill x response
format (text, a JSON-schema grammar, a forced tool call) x images in the prompt (a vision target with
a text-only draft). The default run covers every pair of factor values (a greedy pairwise design);
the whole product is ``slow``. The target is moved off init and the draft is a noisy copy, so every
cell sees rejected drafts, rolled-back caches and (in grammar cells) rolled-back grammar matchers;
the constraints themselves roll back to exactly the state they had."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable

import pytest
import torch

from longmoe.data.chat import TOOL_CALL
from longmoe.data.images import image_span
from longmoe.layers.vision import Patches
from longmoe.model import LongMoE
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from longmoe.serve.structured import JsonFormat, JsonGrammars
from longmoe.serve.tool_calls import forced_call
from tests.helpers.models import VISION, VOCAB, tiny_model, tiny_vision_model
from tests.serve.test_serve_speculative import noisy_copy

FACTORS: dict[str, list] = {
    "k": [1, 3, 5],
    "prefix": ["none", "partial", "full"],
    "session": [False, True],
    "chunked": [False, True],
    "fmt": ["text", "json", "tool"],
    "images": [False, True],
}
BLOCK = 16  # prefix_block_size of the speculative engines: hits land on the KDA chunk grid (16)
CHUNK = 48  # their prefill_chunk: a "chunked" prompt is longer
SHARED = 16  # tokens a "partial" hit shares with an earlier prompt (< every prompt's last boundary)
DRAFT_NOISE = 0.1  # on the draft's LM head: it disagrees with the target often, agrees at times
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "n", "tag"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 8}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "ping"}},
]


def pairwise(factors: dict[str, list]) -> list[dict]:
    """A small set of cells that together hold every pair of values of any two factors (greedy: each
    next cell is the one covering most pairs not yet covered; deterministic)."""
    names = list(factors)
    cells = [dict(zip(names, vals, strict=True)) for vals in itertools.product(*factors.values())]

    def pairs(c: dict) -> set:
        return {(a, c[a], b, c[b]) for a, b in itertools.combinations(names, 2)}

    todo = set().union(*(pairs(c) for c in cells))
    out = []
    while todo:
        best = max(cells, key=lambda c: len(pairs(c) & todo))
        out.append(best)
        todo -= pairs(best)
    return out


ALL = [dict(zip(FACTORS, vals, strict=True)) for vals in itertools.product(*FACTORS.values())]
DEFAULT = pairwise(FACTORS)


def cell_id(c: dict) -> str:
    return "-".join(
        [
            f"k{c['k']}",
            f"prefix_{c['prefix']}",
            "session" if c["session"] else "single",
            "chunked" if c["chunked"] else "onechunk",
            c["fmt"],
            "image" if c["images"] else "text",
        ]
    )


CASES = [pytest.param(c, id=cell_id(c)) for c in DEFAULT] + [
    pytest.param(
        c,
        id=cell_id(c),
        marks=pytest.mark.slow(wall="not measured; each cell about as long as a default one"),
    )
    for c in ALL
    if c not in DEFAULT
]


def text_only_copy(model: LongMoE, scale: float, seed: int = 1) -> LongMoE:
    """A text-only draft of a vision target: its text weights without the image encoder (it reads
    ``<|image_patch|>`` as a plain token), with noise on the LM head."""
    torch.manual_seed(seed)
    d = LongMoE(model.cfg.replace(vision=None))
    d.load_state_dict({k: v for k, v in model.state_dict().items() if k in d.state_dict()})
    with torch.no_grad():
        d.lm_head.weight.add_(torch.randn_like(d.lm_head.weight) * scale)
    return d.eval()


class Engines:
    """One plain (reference) engine per target and one speculative engine per (target, k), shared by
    every cell (made by the module's ``make_engine``, which closes them); prompts differ per cell, so
    a cell's prefix hits are only those it sets up."""

    def __init__(self, tok, make_engine: Callable[..., Engine]) -> None:
        self.tok, self.make = tok, make_engine
        self.targets = {False: tiny_model(), True: tiny_vision_model()}
        self.drafts = {
            False: noisy_copy(self.targets[False], DRAFT_NOISE, head_only=True),
            True: text_only_copy(self.targets[True], DRAFT_NOISE),
        }
        self._plain: dict[bool, Engine] = {}
        self._spec: dict[tuple[bool, int], Engine] = {}
        self.grammars = JsonGrammars(tok, VOCAB)

    def plain(self, vision: bool) -> Engine:
        if vision not in self._plain:
            cfg = dict(prefill_chunk=1024, prefix_cache=False, max_context=1024)
            self._plain[vision] = self.make(self.targets[vision], **cfg)
        return self._plain[vision]

    def spec(self, vision: bool, k: int) -> Engine:
        if (vision, k) not in self._spec:
            cfg = dict(prefill_chunk=CHUNK, prefix_block_size=BLOCK, num_speculative_tokens=k)
            self._spec[vision, k] = self.make(self.targets[vision], self.drafts[vision], **cfg)
        return self._spec[vision, k]


@pytest.fixture(scope="module")
def engines(tok, make_engine) -> Engines:
    return Engines(tok, make_engine)


def settled(e: Engine) -> dict[str, float]:
    """The engine's stats once its loop is idle (the last step's counters are in)."""
    while e.scheduler.n_running or e.scheduler.n_waiting:
        time.sleep(0.001)
    return e.stats()


def rejections(e: Engine) -> int:
    s = settled(e)
    return int(s["spec_proposed"] - s["spec_accepted"])


def text_ids(tok, n: int, rng: random.Random) -> list[int]:
    special = set(tok.special_ids.values())
    out: list[int] = []
    while len(out) < n:
        if (t := rng.randrange(3, VOCAB)) not in special:
            out.append(t)
    return out


def image(seed: int) -> Patches:
    g = torch.Generator().manual_seed(seed)
    p = VISION.patch_size
    return Patches(torch.rand(4, 3 * p * p, generator=g), 2, 2)


def params(engines: Engines, fmt: str) -> SamplingParams:
    constraint = None
    if fmt == "json":
        constraint = engines.grammars.constraint(JsonFormat(SCHEMA))
    elif fmt == "tool":
        constraint = forced_call(engines.grammars, engines.tok.token_to_id(TOOL_CALL), TOOLS)
    # a forced call spends ~25 tokens on '<|tool_call|>{"name": ..., "arguments": ' (the test tokenizer
    # has few merges), where the grammar leaves the models few choices: give it room to disagree
    n = {"text": 10, "json": 20, "tool": 40}[fmt]
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, constraint=constraint)


@pytest.mark.parametrize("cell", CASES)
def test_speculative_greedy_equals_plain(engines, tok, cell):
    k, vision = cell["k"], cell["images"]
    spec, plain = engines.spec(vision, k), engines.plain(vision)
    rng = random.Random(ALL.index(cell))
    imgs = [image(ALL.index(cell))] if vision else []
    head = [tok.bos_id] + [t for p in imgs for t in image_span(p, tok)]
    n = 64 if cell["chunked"] else 40
    prompt = head + text_ids(tok, n - len(head), rng)
    p = params(engines, cell["fmt"])
    last_boundary = (len(prompt) - 1) // BLOCK * BLOCK

    if cell["prefix"] == "partial":  # an earlier prompt shares the first SHARED tokens only
        other = text_ids(tok, 1, rng)
        while other[0] == prompt[SHARED]:
            other = text_ids(tok, 1, rng)
        spec.generate(prompt[:SHARED] + other, SamplingParams(max_tokens=1), images=imgs)
    elif cell["prefix"] == "full":  # the same prompt came before
        spec.generate(prompt, SamplingParams(max_tokens=1), images=imgs)
    rejected = rejections(spec)

    session = spec.open_session() if cell["session"] else None
    got = spec.generate(prompt, p, session=session, images=imgs)
    assert got.token_ids == plain.generate(prompt, p, images=imgs).token_ids
    if cell["prefix"] == "none":
        assert got.cached_tokens == 0
    elif cell["prefix"] == "partial":
        assert 0 < got.cached_tokens <= SHARED
    else:
        assert got.cached_tokens >= last_boundary > SHARED

    if session is not None:  # turn 2 continues the kept row, which speculation must leave exact
        new = text_ids(tok, 20 if cell["chunked"] else 5, rng)
        second = spec.generate(new, p, session=session)
        context = session.tokens[: len(session.tokens) - len(second.token_ids)]
        assert context == prompt + got.token_ids + new
        assert second.cached_tokens == len(prompt) + len(got.token_ids) - 1
        assert second.token_ids == plain.generate(context, p, images=imgs).token_ids
        spec.close_session(session)
    assert rejections(spec) > rejected  # the cell exercised rejection and rollback


def test_default_cells_cover_every_pair():
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        seen = {(c[a], c[b]) for c in DEFAULT}
        assert seen == set(itertools.product(FACTORS[a], FACTORS[b])), (a, b)
    assert len(DEFAULT) < len(ALL) // 10


def test_constraints_roll_back_to_the_state_they_had(engines, tok):
    """What speculation relies on: after accepting a whole document and rolling back to any length,
    a grammar (and a forced call) masks and completes exactly as one that accepted only that prefix."""
    doc = tok.encode('{"name": "ab\u00e9", "n": 7, "tag": "red"}', bos=False)
    call = [tok.token_to_id(TOOL_CALL), *tok.encode('{"name": "ping", "arguments": {}}', bos=False)]
    for fmt, ids in (("json", doc), ("tool", call)):
        make = params(engines, fmt).constraint
        assert make is not None
        full = make()
        for t in ids:
            full.accept(t)
        assert full.done
        for i in range(len(ids), -1, -1):
            fresh = make()
            for t in ids[:i]:
                fresh.accept(t)
            a, b = torch.zeros(VOCAB), torch.zeros(VOCAB)
            full.mask(a)
            fresh.mask(b)
            assert torch.equal(a, b) and full.done == fresh.done, (fmt, i)
            if i:
                full.rollback(1)
        with pytest.raises(ValueError, match="rollback"):
            full.rollback(1)
