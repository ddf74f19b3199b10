"""Training data mix: corpus documents plus synthetic long-context task documents, by weight.

Source names used in a curriculum stage's ``mix`` (``{"file": 0.7, "synthetic": 0.3}``):

- ``file``: whole documents (standard-library files, or the user's ``--data`` documents),
- ``package``: standard-library per-package concatenations (long); with ``--data`` the same as ``file``,
- ``synthetic`` / ``synthetic:<task>``: documents rendered from the task generators of
  ``longmoe.tasks`` (its families: ``niah``, ``multihop``, ``conflict``, ``recall``), so long windows
  contain dependencies that need the long context. ``synthetic`` cycles through all families.

The mix picks the source of document ``i`` from a hash of ``(seed, i)``: no RNG object to save, so
the mix position is just ``i`` plus each source's own position. The mix lives in ``train``, above both
``data`` (corpus, packing) and ``tasks`` (which builds on ``data``), so neither imports the other's user.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longmoe.data.corpus import Document, corpus_documents
from longmoe.data.packing import DocSource, StreamSource
from longmoe.data.stages import SYNTHETIC_LOSS, valid_length_range
from longmoe.data.tokenizer import Tokenizer
from longmoe.tasks import FAMILIES, TooShortError, generate

SYNTHETIC_TASKS: tuple[str, ...] = tuple(FAMILIES)  # the task families of the registry


def _unit(seed: int, i: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, i)."""
    return random.Random(f"mix:{seed}:{i}").random()


class MixSource:
    """Draws each document from one of several sources with the given weights (deterministic)."""

    def __init__(self, sources: dict[str, DocSource], weights: dict[str, float], seed: int) -> None:
        if set(sources) != set(weights):
            raise ValueError(f"mix weights {sorted(weights)} must name exactly the sources {sorted(sources)}")
        total = sum(weights.values())
        if total <= 0 or any(w < 0 for w in weights.values()):
            raise ValueError(f"mix weights {weights} are invalid: expected non-negative with a positive sum")
        self.names = sorted(sources)
        self.sources = sources
        self.cum: list[float] = []
        acc = 0.0
        for n in self.names:
            acc += weights[n] / total
            self.cum.append(acc)
        self.seed, self.i = seed, 0

    def pick(self, i: int) -> str:
        u = _unit(self.seed, i)
        for n, c in zip(self.names, self.cum):
            if u < c:
                return n
        return self.names[-1]

    def next(self) -> Document:
        name = self.pick(self.i)
        self.i += 1
        return self.sources[name].next()

    def state(self) -> dict[str, Any]:
        return {"i": self.i, "sources": {n: s.state() for n, s in self.sources.items()}}

    def restore(self, state: dict[str, Any]) -> None:
        self.i = int(state["i"])
        for n, s in self.sources.items():
            s.restore(state["sources"][n])


class SyntheticSource:
    """Task documents ``context + question + answer`` from ``longmoe.tasks.generate``.

    Document ``i`` uses task ``tasks[i % len(tasks)]``, seed ``seed + i`` and a needle depth drawn from
    ``(seed, i)``, so any position is reproducible without replaying the previous ones. Documents are
    ``length × U[length_range]`` tokens, not the full window: packed back to back with bos/eos, a
    full-window document would always be cut, its question and answer landing in the next window
    without the context they depend on. A draw too short for its task (some cannot be short) is
    redrawn at the range's upper end, then at 0.9 x ``length``.

    With ``loss="answer"`` only the answer (and the closing eos) is a target: the filler and question
    are context, as in SFT. Small models otherwise spend nearly all of a task document's gradient on
    predicting filler prose and learn retrieval very slowly (docs/eval.md has the measurements).
    """

    length_range: tuple[float, float] = (0.4, 0.9)

    def __init__(
        self,
        tasks: tuple[str, ...],
        length: int,
        seed: int,
        tokenizer: Tokenizer,
        loss: str = "all",
        length_range: tuple[float, float] | None = None,
    ) -> None:
        if loss not in SYNTHETIC_LOSS:
            raise ValueError(f"synthetic loss={loss!r} is invalid: expected one of {SYNTHETIC_LOSS}")
        if length_range is not None:
            if not valid_length_range(length_range):
                raise ValueError(
                    f"synthetic length_range={length_range} is invalid: expected 0 < lo <= hi < 1"
                )
            self.length_range = (float(length_range[0]), float(length_range[1]))
        self.tasks, self.length, self.seed, self.tokenizer = tasks, length, seed, tokenizer
        self.loss = loss
        self.i = 0

    def next(self) -> Document:
        task = self.tasks[self.i % len(self.tasks)]
        depth = round(_unit(self.seed + 7919, self.i), 3)
        lo, hi = self.length_range
        frac = lo + (hi - lo) * _unit(self.seed + 104729, self.i)
        item, err = None, None
        # a short draw may not fit a task: redraw at the range's upper end, then at 0.9 x the window
        tries = dict.fromkeys((int(self.length * frac), int(self.length * hi), int(self.length * 0.9)))
        for length in tries:
            try:
                item = generate(
                    task, n=1, length=length, seed=self.seed + self.i, tokenizer=self.tokenizer, depth=depth
                )[0]
                break
            except TooShortError as e:
                err = e
        if item is None:
            raise err  # type: ignore[misc]
        self.i += 1
        loss_from = len(item.prompt()) if self.loss == "answer" else None
        return Document(item.to_text(), f"synthetic:{task}:{self.seed + self.i - 1}", loss_from)

    def state(self) -> dict[str, Any]:
        return {"i": self.i}

    def restore(self, state: dict[str, Any]) -> None:
        self.i = int(state["i"])


def make_source(
    name: str,
    split: str,
    seed: int,
    tokenizer: Tokenizer | None = None,
    data: str | Path | None = None,
    synthetic_length: int = 1024,
    synthetic_loss: str = "all",
    synthetic_range: tuple[float, float] | None = None,
) -> DocSource:
    """Build the named source (see module docstring) for ``split``; shuffled per epoch with ``seed``."""
    if name in ("file", "package"):
        kind = name if data is None else "file"

        def factory(epoch: int) -> Iterator[Document]:
            return corpus_documents(data, split=split, kind=kind, shuffle_seed=seed, epoch=epoch)

        return StreamSource(factory, name=f"{name}:{data or 'stdlib'}:{split}")
    if name == "synthetic" or name.startswith("synthetic:"):
        tasks = SYNTHETIC_TASKS if name == "synthetic" else tuple(name.split(":", 1)[1].split("+"))
        bad = [t for t in tasks if t not in SYNTHETIC_TASKS]
        if bad:
            raise ValueError(f"unknown synthetic task(s) {bad} in source {name!r}; known: {SYNTHETIC_TASKS}")
        if tokenizer is None:
            raise ValueError("synthetic sources need the tokenizer (lengths are in tokens)")
        split_seed = seed + (0 if split == "train" else 10**6)
        return SyntheticSource(
            tasks, synthetic_length, split_seed, tokenizer, synthetic_loss, synthetic_range
        )
    raise ValueError(
        f"unknown data source {name!r}: expected 'file', 'package', 'synthetic' or "
        f"'synthetic:<task>[+<task>...]' with tasks from {SYNTHETIC_TASKS}"
    )


def make_mix(
    mix: dict[str, float],
    split: str,
    seed: int,
    tokenizer: Tokenizer | None = None,
    data: str | Path | None = None,
    synthetic_length: int = 1024,
    synthetic_loss: str = "all",
    synthetic_range: tuple[float, float] | None = None,
) -> DocSource:
    """One ``MixSource`` over the sources named in ``mix`` (a single source is returned as is)."""
    active = {n: w for n, w in mix.items() if w > 0}
    if not active:
        raise ValueError(f"data mix {mix} has no source with a positive weight")
    srcs = {
        n: make_source(n, split, seed + k, tokenizer, data, synthetic_length, synthetic_loss, synthetic_range)
        for k, n in enumerate(sorted(active))
    }
    if len(srcs) == 1:
        return next(iter(srcs.values()))
    return MixSource(srcs, active, seed)
