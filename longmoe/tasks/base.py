"""Shared machinery of the task generators: the item type, real-text filler, and length fitting.

A task family only decides *what* to hide (needle sentences with their relative positions), what to
ask and what the answers are (a ``Spec``). ``build_item`` then surrounds the needles with filler
prose taken from the embedded corpus (docstrings of the interpreter's standard library: real,
varied English, no download) and cuts the filler so that the prompt is ``length`` tokens long in the
model's own tokenizer (within ``LENGTH_TOL``; in practice within a few tokens).

Everything is a pure function of ``(task, variant, seed, index, length, depth)`` and the tokenizer,
so a training document or an evaluation item can be regenerated anywhere.
"""

from __future__ import annotations

import functools
import inspect
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from longmoe.data.corpus import stdlib_files, stdlib_root
from longmoe.data.tokenizer import Tokenizer
from longmoe.errors import UserError

LENGTH_TOL = 0.02  # acceptance: prompt tokens within ±2% of the target
_FIT_TOL = 0.002  # what the fitting loop aims for (leaves margin for re-tokenisation at the cut)
SHORT_LENGTH = 1536  # below this many tokens, families hide fewer needles so that filler remains
_MIN_FILLER_CHARS = 1_500_000  # pool size read up front (about 400k tokens with a 2k-vocab BPE)


def _words(s: str) -> tuple[str, ...]:
    return tuple(s.split())


ADJECTIVES = _words(
    "amber azure brisk cobalt crimson dusky emerald fabled gilded hollow ivory jade keen lunar mossy "
    "nimble ochre pearly quiet russet scarlet tawny umber velvet wintry xanthic yonder zesty brazen "
    "coral dapper feral glassy hazel indigo jolly khaki lilac mellow nordic opal plucky quartz rustic "
    "silken teal unruly vivid woolly"
)
NOUNS = _words(
    "falcon otter badger heron lynx marten osprey panther quokka raven salmon tapir urchin vole "
    "walrus yak zebra beacon cairn delta ember fjord geyser harbor islet jetty kiln lagoon mesa "
    "nebula orchard prairie quarry ravine summit tundra upland valley wharf anvil bellows chisel "
    "dynamo easel funnel gimbal hinge lantern"
)
PLACES = _words(
    "Zorvath Quellmoor Brindlecast Ostrevane Kelmarsh Vantoria Drossel Myrrhen Tallowick Ezmerin "
    "Pellgrave Corsivane Umbridge Halvorn Sketterby Norwind Farrowgate Lisbarrow Yendral Quimsby"
)


class TaskError(UserError, ValueError):
    """A task request that cannot be generated (unknown task/variant, length too short, bad depth)."""


class TooShortError(TaskError):
    """The drawn needles and question do not leave room for filler at the requested length."""


@dataclass
class TaskItem:
    """One long-context problem: ``context`` + ``question`` -> one or more ``answers``.

    ``prompt()`` is what a model is asked, ``to_text()`` the same followed by the answer (a training
    document). ``metadata`` has at least task, variant, length (target tokens), n_tokens (prompt
    tokens actually produced), depth, hops, n_conflicts, n_needles and the needle sentences.
    """

    context: str
    question: str
    answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)

    def prompt(self) -> str:
        return render_prompt(self.context, self.question)

    def answer_text(self) -> str:
        return ", ".join(self.answers)

    def to_text(self) -> str:
        return f"{self.prompt()} {self.answer_text()}\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "question": self.question,
            "answers": list(self.answers),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskItem:
        for k in ("context", "question", "answers"):
            if k not in d:
                raise TaskError(f"task item dict is missing the field {k!r}")
        if not isinstance(d["answers"], list):
            raise TaskError(f"task item field 'answers' must be a list of strings, got {type(d['answers'])}")
        return cls(
            str(d["context"]), str(d["question"]), [str(a) for a in d["answers"]], dict(d.get("metadata", {}))
        )

    @property
    def item_id(self) -> str:
        m = self.metadata
        return f"{m.get('task')}:{m.get('length')}:{m.get('depth')}:{m.get('seed')}:{m.get('index')}"


def render_prompt(context: str, question: str) -> str:
    return f"{context}\n\nQuestion: {question}\nAnswer:"


@dataclass
class Spec:
    """What a task family hides and asks. ``needles`` are ``(position in [0, 1], sentence)``."""

    needles: list[tuple[float, str]]
    question: str
    answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)
    forbidden: list[str] = field(default_factory=list)  # strings that must not occur in the filler


# A family's spec function: ``make_spec(rng, variant, depth, length) -> Spec``.
SpecFn = Callable[[random.Random, str, float, int], Spec]


# ---------------------------------------------------------------------- random helpers
def item_rng(task: str, variant: str, seed: int, index: int, length: int) -> random.Random:
    return random.Random(f"longmoe-task:{task}:{variant}:{seed}:{index}:{length}")


def number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def distinct(rng: random.Random, n: int, draw: Any) -> list[str]:
    """``n`` distinct values from the zero-argument-after-rng function ``draw``."""
    out: list[str] = []
    while len(out) < n:
        v = draw(rng)
        if v not in out:
            out.append(v)
    return out


def key_name(rng: random.Random) -> str:
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


def var_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(5))


def spread(rng: random.Random, depth: float, n: int) -> list[float]:
    """Positions for ``n`` needles: the first at ``depth``, the others uniform over the context."""
    return [depth] + [rng.random() for _ in range(n - 1)]


# ---------------------------------------------------------------------- filler
_DOC_RE = re.compile(r'"""(.*?)"""|\'\'\'(.*?)\'\'\'', re.DOTALL)
_PROSE_CHARS = re.compile(r"[A-Za-z ,.;:'()\-\n]")


def _prose_paragraphs(source: str) -> list[str]:
    """Prose paragraphs of the docstrings in a Python source file (ASCII, mostly letters)."""
    out = []
    for m in _DOC_RE.finditer(source):
        doc = inspect.cleandoc(m.group(1) or m.group(2) or "")
        for para in re.split(r"\n\s*\n", doc):
            para = para.strip()
            if len(para) < 80 or not para.isascii() or ">>>" in para or "::" in para:
                continue
            if len(_PROSE_CHARS.findall(para)) < 0.9 * len(para):
                continue
            out.append(" ".join(para.split()))  # one paragraph = one line of text
    return out


@functools.lru_cache(maxsize=1)
def filler_pool() -> tuple[str, ...]:
    """Unique prose paragraphs from the standard library (sorted file order: deterministic)."""
    root, seen, pool, chars = stdlib_root(), set(), [], 0
    for rel in stdlib_files("train"):
        for p in _prose_paragraphs((root / rel).read_text(encoding="utf-8", errors="replace")):
            if p not in seen:
                seen.add(p)
                pool.append(p)
                chars += len(p)
        if chars >= _MIN_FILLER_CHARS:
            break
    if len(pool) < 50:
        raise TaskError("the standard library yielded too little docstring prose to use as filler")
    return tuple(pool)


def filler_text(rng: random.Random, n_chars: int) -> str:
    """Consecutive pool paragraphs from a random start, joined by newlines, at least ``n_chars`` long."""
    pool = filler_pool()
    i = rng.randrange(len(pool))
    parts, total = [], 0
    while total < n_chars:
        parts.append(pool[i % len(pool)])
        total += len(parts[-1]) + 1
        i += 1
    return "\n".join(parts)


# ---------------------------------------------------------------------- assembly
def _insert(filler: str, needles: list[tuple[float, str]]) -> str:
    """Put each needle on its own line at the line boundary nearest its relative position."""
    if not filler:
        return "\n".join(s for _, s in sorted(needles, key=lambda t: t[0]))
    cuts = [0] + [m.end() for m in re.finditer("\n", filler)] + [len(filler) + 1]
    placed = []
    for order, (pos, sent) in enumerate(needles):
        target = pos * len(filler)
        c = min(cuts, key=lambda x: (abs(x - target), x))
        placed.append((c, order, sent))
    placed.sort()
    out, prev = [], 0
    for c, _, sent in placed:
        c = min(c, len(filler))
        seg = filler[prev:c]
        if seg:
            out.append(seg.rstrip("\n"))
        out.append(sent)
        prev = c
    tail = filler[prev:].lstrip("\n")
    if tail:
        out.append(tail)
    return "\n".join(out)


def build_item(
    spec: Spec, rng: random.Random, length: int, tokenizer: Tokenizer, base_meta: dict[str, Any]
) -> TaskItem:
    """Fit filler around ``spec``'s needles so that ``prompt()`` is ``length`` tokens (±_FIT_TOL)."""
    count = lambda s: len(tokenizer.encode(s))
    bare = count(render_prompt(_insert("", spec.needles), spec.question))
    if bare > 0.9 * length:
        raise TooShortError(
            f"length={length} is too short for task {base_meta.get('task')!r} "
            f"variant {base_meta.get('variant')!r}: its needles and question alone take {bare} tokens"
        )
    budget = length - bare
    sample = filler_text(random.Random(0), 4000)
    chars_per_tok = len(sample) / max(1, count(sample))
    text = filler_text(rng, int(budget * chars_per_tok * 1.3) + 200)
    ids = tokenizer.encode(text)
    while len(ids) < budget + 64:  # denser text than the estimate: read more paragraphs
        text += "\n" + filler_text(rng, int(budget * chars_per_tok * 0.5) + 200)
        ids = tokenizer.encode(text)
    n, prompt_tokens, context = budget, 0, ""
    for _ in range(12):
        filler = tokenizer.decode(ids[:n])
        context = _insert(filler, spec.needles)
        prompt_tokens = count(render_prompt(context, spec.question))
        err = length - prompt_tokens
        if abs(err) <= max(1, _FIT_TOL * length):
            break
        n = max(0, min(len(ids), n + err))
    if abs(prompt_tokens - length) > LENGTH_TOL * length:
        raise TaskError(
            f"could not fit task {base_meta.get('task')!r} to {length} tokens (got {prompt_tokens})"
        )
    meta = dict(base_meta)
    meta.update(spec.metadata)
    meta.update(
        length=length,
        n_tokens=prompt_tokens,
        n_needles=len(spec.needles),
        needles=[s for _, s in spec.needles],
    )
    meta.setdefault("hops", 0)
    meta.setdefault("n_conflicts", 0)
    return TaskItem(context=context, question=spec.question, answers=list(spec.answers), metadata=meta)


def make_item(
    make_spec: SpecFn,
    task: str,
    variant: str,
    seed: int,
    index: int,
    length: int,
    depth: float | None,
    tokenizer: Tokenizer,
) -> TaskItem:
    """Draw a spec whose hidden strings do not occur in the chosen filler, then build the item."""
    rng = item_rng(task, variant, seed, index, length)
    d = rng.random() if depth is None else float(depth)
    if not 0.0 <= d <= 1.0:
        raise TaskError(f"depth={depth} is invalid: expected a number in [0, 1] or None")
    base = {"task": task, "variant": variant, "seed": seed, "index": index, "depth": round(d, 4)}
    # The context with the needles removed must not contain a hidden string: redraw if it does.
    too_short: TooShortError | None = None
    for attempt in range(20):
        spec = make_spec(rng, variant, d, length)
        try:
            item = build_item(spec, rng, length, tokenizer, base)
        except TooShortError as e:  # a smaller draw (fewer reports, hops, lines) may fit
            too_short = e
            continue
        rest = item.context
        for s in item.metadata["needles"]:
            rest = rest.replace(s, "")
        if not any(re.search(rf"\b{re.escape(f)}\b", rest) for f in spec.forbidden):
            if attempt:
                item.metadata["redraws"] = attempt
            return item
    if too_short is not None:
        raise too_short
    raise TaskError(f"could not draw hidden values absent from the filler for task {task!r}")
