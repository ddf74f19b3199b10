"""The model runner: every forward pass of the engine, and the logits that become tokens.

As vLLM's model runner, it owns the model and what runs it: the batch cache of the running rows
(``batch``; rows of different lengths, MLA rows masked to their own length), prefill chunks into the
requests' own caches, batched decode steps, the compiled steps (``serve/compiled.py``), the speculator
(``serve/speculative.py``: draft, verify, roll back), and the logit processing before a token is
chosen: banned tokens (a vision model's image tokens; decode has no pixels), then each request's own
processors (penalties, grammar, ``serve/sampling.py``). It knows nothing of queues, budgets or
tokenizers: the scheduler (``serve/scheduler.py``) decides what runs, the engine passes it here.

Rows never interact (the model is row-independent and MoE routing is per token), so a request's
tokens are the same alone or batched; sampling depends only on its own logits and seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from longmoe.cache import Cache
from longmoe.model import LongMoE
from longmoe.serve.compiled import CompiledSteps
from longmoe.serve.prompt_images import chunk_embeds
from longmoe.serve.request import Request
from longmoe.serve.sampling import TokenChoice, sample
from longmoe.serve.speculative import Speculator

# emit(request, choice) -> whether the request wants more tokens
Emit = Callable[[Request, TokenChoice], bool]


class ModelRunner:
    """Forward passes over ``model`` (and a draft's layers in the same caches when speculating)."""

    def __init__(
        self,
        model: LongMoE,
        *,
        compile: bool = False,
        draft: LongMoE | None = None,
        num_speculative_tokens: int = 4,
        banned: Sequence[int] = (),
    ) -> None:
        """``draft`` turns on speculative decoding; ``banned``: token ids never to be chosen."""
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.compiled = CompiledSteps(model) if compile else None
        self.speculator = (
            None if draft is None else Speculator(model, draft.to(self.device), num_speculative_tokens)
        )
        self.banned = torch.tensor(list(banned), device=self.device) if banned else None
        if self.speculator is not None:
            self.speculator.banned = self.banned
        self.batch: Cache | None = None  # the running rows, in the scheduler's ``running`` order
        # prefix reuse: record recurrent states at chunk boundaries inside prefill calls (``r.taps``);
        # not under --compile (a side effect inside the compiled graph)
        self.taps = False

    def new_cache(self) -> Cache:
        """An empty one-row cache (the draft model's layers included when speculating)."""
        if self.speculator is not None:
            return self.speculator.new_cache(1, self.device)
        return self.model.new_cache(1, self.device)

    # ------------------------------------------------------------------ forward passes
    def _forward(
        self, x: torch.Tensor, cache: Cache, image_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Prompt tokens ``x [B, T]`` into ``cache`` (and the draft's layers); the target's logits of (at
        least) the last position."""
        if self.speculator is not None:
            return self.speculator.forward(x, cache, image_embeds)
        return self.model(x, cache=cache, image_embeds=image_embeds, logits_to_keep=1).logits  # [B, 1, V]

    def last_logits(
        self, x: torch.Tensor, cache: Cache, image_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of the last position of ``x [B, T]`` continuing ``cache``: through the
        speculator when there is a draft (its layers live in the same cache and must see the prompt too),
        else the compiled steps or the eager model (always for a chunk with images); banned tokens -inf."""
        if self.speculator is not None or self.compiled is None or image_embeds is not None:
            if self.compiled is not None:  # a shape-static model writes latents into reserved room
                cache.reserve(x.shape[1])
            logits = self._forward(x, cache, image_embeds)[:, -1]
        else:
            logits = self.compiled(x, cache)[:, -1]
        return logits if self.banned is None else logits.index_fill(-1, self.banned, -torch.inf)

    def prefill(self, group: Sequence[Request], n: int) -> torch.Tensor:
        """Feed prompt tokens ``[r.n_fed, r.n_fed + n)`` of each request into its own cache in one
        ``[k, n]`` forward (rows may have different cached lengths; the cache masks per row); each
        prompt's images give the embeddings of the patch tokens fed. Returns the logits ``[k, V]``."""
        x = torch.tensor(
            [r.prompt_ids[r.n_fed : r.n_fed + n] for r in group], dtype=torch.long, device=self.device
        )  # [k, n]
        emb = chunk_embeds(self.model, [(r.images, r.n_fed, r.n_fed + n) for r in group])  # [m, d] | None
        one = len(group) == 1
        cache = group[0].cache if one else Cache.stack([r.cache for r in group if r.cache is not None])
        assert cache is not None
        tap = self.taps and self.compiled is None and any(r.block_hashes for r in group)
        if tap:
            cache.start_taps()
        logits = self.last_logits(x, cache, emb)  # [k, V]
        if tap:
            for r, t in zip(group, cache.take_taps(), strict=True):
                r.taps = {r.n_fed + p: states for p, states in t.items()}  # at absolute prompt positions
        if not one:
            for r, c in zip(group, cache.split(), strict=True):
                r.cache = c
        return logits

    def decode(self, reqs: Sequence[Request], emit: Emit) -> list[int] | None:
        """One decode step of the batch (rows ``reqs``, each ending in ``r.out[-1]``); every chosen
        token goes to ``emit``. Returns the new row order when speculation permuted the rows."""
        assert self.batch is not None
        if self.speculator is not None:
            self.batch, order = self.speculator.step(reqs, self.batch, emit)
            return order
        x = torch.tensor([[r.out[-1]] for r in reqs], dtype=torch.long, device=self.device)  # [B, 1]
        logits = self.last_logits(x, self.batch)  # [B, V]
        greedy_rows = [i for i, r in enumerate(reqs) if r.plain_greedy]
        fast = {}
        if greedy_rows:  # one batched argmax for the rows that need no processing
            idx = torch.tensor(greedy_rows, device=self.device)
            fast = dict(zip(greedy_rows, logits.index_select(0, idx).argmax(-1).tolist(), strict=True))
        for i, r in enumerate(reqs):
            emit(r, TokenChoice(fast[i]) if i in fast else self.choose(r, logits[i]))
        return None

    def choose(self, r: Request, logits: torch.Tensor) -> TokenChoice:
        """The token for ``logits [V]``: the argmax, or the request's processors and sampler."""
        if r.plain_greedy:
            return TokenChoice(int(torch.argmax(logits)))
        assert r.sampler is not None
        return sample(logits, r.sampler)

    # ------------------------------------------------------------------ batch membership
    def regroup(self, keep: list[int] | None, rows_kept: list[int], joining: Sequence[Cache]) -> list[Cache]:
        """Change the batch membership: rows ``keep`` stay (None: all do), then ``joining`` one-row
        caches are appended. Returns the rows ``rows_kept`` (finished sessions' rows) as one-row caches."""
        rows = [self.batch.select([i]) for i in rows_kept] if self.batch is not None else []
        if keep is not None:
            self.batch = self.batch.select(keep) if keep and self.batch is not None else None
        if joining:
            self.batch = Cache.stack(([self.batch] if self.batch is not None else []) + list(joining))
        return rows

    def batch_bytes(self) -> int:
        return self.batch.nbytes() if self.batch is not None else 0
