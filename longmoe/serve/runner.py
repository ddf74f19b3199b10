"""The model runner: every forward pass of the engine, and the logits that become tokens.

As vLLM's model runner, it owns the model and what runs it: the batch cache of the running rows
(``batch``, rows ``rows``; rows of different lengths, MLA rows masked to their own length), prefill
chunks into the requests' own caches, batched decode steps, the compiled steps (``serve/compiled.py``),
the speculator (``serve/speculative.py``: draft, verify, roll back), and the logit processing before a
token is chosen: banned tokens (a vision model's image tokens; decode has no pixels), then each
request's own processors (penalties, grammar, ``serve/sampling.py``). It knows nothing of queues,
budgets, tokenizers or text: ``execute(plan)`` runs what the scheduler planned and returns a
``StepOutput`` (``serve/step.py``); it never calls back.

Rows never interact (the model is row-independent and MoE routing is per token), so a request's
tokens are the same alone or batched; sampling depends only on its own logits and seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from longmoe.cache import Cache
from longmoe.model import LongMoE
from longmoe.serve.compiled import CompiledSteps
from longmoe.serve.prompt_images import chunk_embeds
from longmoe.serve.request import Request
from longmoe.serve.sampling import TokenChoice, sample
from longmoe.serve.speculative import Speculator
from longmoe.serve.step import RowOutput, StepOutput, StepPlan


class ModelRunner:
    """Forward passes over ``model`` (and a draft's layers in the same caches when speculating)."""

    def __init__(
        self,
        model: LongMoE,
        *,
        compile: bool = False,
        draft: LongMoE | None = None,
        num_speculative_tokens: int,
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
        self.batch: Cache | None = None  # the running rows' caches, one row per request of ``rows``
        self.rows: list[Request] = []
        # prefix reuse: record recurrent states at chunk boundaries inside prefill calls
        # (``StepOutput.chunk_states``); not under --compile (a side effect inside the compiled graph)
        self.record_states = False

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

    def all_logits(
        self, x: torch.Tensor, cache: Cache, image_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` (fp32, as the model gives them: scores see no banned tokens) of every
        position of ``x [B, T]``: a scored prompt (``SamplingParams.prompt_logprobs``); always eager."""
        if self.compiled is not None:  # a shape-static model writes latents into reserved room
            cache.reserve(x.shape[1])
        if self.speculator is not None:
            logits = self.speculator.forward(x, cache, image_embeds)
        else:
            logits = self.model(x, cache=cache, image_embeds=image_embeds).logits
        return logits.float()

    # ------------------------------------------------------------------ one step
    def execute(self, plan: StepPlan) -> StepOutput:
        """Run ``plan``: rows leave, a decode step over the batch, a prefill chunk; rows that finished
        (``Request.stop_reason``) leave the batch and completed prompts join it."""
        out = StepOutput()
        if plan.leaving:
            self._leave(plan.leaving, out)
        assert len(plan.decode) == len(self.rows), "the plan's running rows are the runner's"
        if self.rows:
            self._decode(out)
        joining = self._prefill(plan.prefill, plan.chunk, out) if plan.prefill else []
        done = {rid: True for rid, row in out.decoded.items() if row.finish is not None}
        if done:
            self._leave(done, out)
        if joining:
            self.batch = Cache.stack(
                ([self.batch] if self.batch is not None else []) + [r.cache for r in joining]
            )
            self.rows += joining
            out.joined = [r.id for r in joining]
        return out

    def _leave(self, leaving: dict[int, bool], out: StepOutput) -> None:
        """Rows ``leaving`` leave the batch; those marked True (and not cancelled) are handed back."""
        assert self.batch is not None
        for i, r in enumerate(self.rows):
            if leaving.get(r.id) and r.lives_on:
                out.rows[r.id] = self.batch.select([i])
        keep = [i for i, r in enumerate(self.rows) if r.id not in leaving]
        if len(keep) < len(self.rows):
            self.batch = self.batch.select(keep) if keep else None
            self.rows = [self.rows[i] for i in keep]

    def _decode(self, out: StepOutput) -> None:
        """One decode step of the batch (each row ends in ``r.out[-1]``)."""
        assert self.batch is not None
        reqs = self.rows
        if self.speculator is not None:
            self.batch, order, rows = self.speculator.step(reqs, self.batch)
            for r, row in zip(reqs, rows, strict=True):
                out.decoded[r.id] = row
            self.rows = [reqs[i] for i in order]
            return
        x = torch.tensor([[r.out[-1]] for r in reqs], dtype=torch.long, device=self.device)  # [B, 1]
        logits = self.last_logits(x, self.batch)  # [B, V]
        greedy_rows = [i for i, r in enumerate(reqs) if r.plain_greedy]
        fast = {}
        if greedy_rows:  # one batched argmax for the rows that need no processing
            idx = torch.tensor(greedy_rows, device=self.device)
            fast = dict(zip(greedy_rows, logits.index_select(0, idx).argmax(-1).tolist(), strict=True))
        for i, r in enumerate(reqs):
            c = TokenChoice(fast[i]) if i in fast else self.choose(r, logits[i])
            out.decoded[r.id] = RowOutput([c], r.stop_reason(c.token, len(r.out) + 1))

    def _prefill(self, group: Sequence[Request], n: int, out: StepOutput) -> list[Request]:
        """Feed prompt tokens ``[r.n_fed, r.n_fed + n)`` of each request into its own cache in one
        ``[k, n]`` forward (rows may have different cached lengths; the cache masks per row); each
        prompt's images give the embeddings of the patch tokens fed. A completed prompt gets its first
        token; returns those that go on (they join the batch; ``r.cache`` stays for the scheduler's
        snapshots until its ``update``)."""
        x = torch.tensor(
            [r.prompt_ids[r.n_fed : r.n_fed + n] for r in group], dtype=torch.long, device=self.device
        )  # [k, n]
        emb = chunk_embeds(self.model, [(r.images, r.n_fed, r.n_fed + n) for r in group])  # [m, d] | None
        one = len(group) == 1
        cache = group[0].cache if one else Cache.stack([r.cache for r in group if r.cache is not None])
        assert cache is not None
        record = self.record_states and self.compiled is None and any(r.block_hashes for r in group)
        if record:
            cache.record_chunk_states()
        if group[0].scoring:
            assert one, "a scored prompt is prefilled alone"
            every = self.all_logits(x, cache, emb)  # [1, n, V]
            self._score(group[0], every[0], out)
            logits = every[:, -1]  # [1, V]
            if self.banned is not None:
                logits = logits.index_fill(-1, self.banned, -torch.inf)
        else:
            logits = self.last_logits(x, cache, emb)  # [k, V]
        if record:
            for r, t in zip(group, cache.take_chunk_states(), strict=True):
                out.chunk_states[r.id] = {r.n_fed + p: states for p, states in t.items()}  # absolute
        if not one:
            for r, c in zip(group, cache.split(), strict=True):
                r.cache = c
        joining = []
        for i, r in enumerate(group):
            out.fed[r.id] = n
            if r.n_fed + n < len(r.prompt_ids):
                continue
            if r.params.max_tokens == 0:  # scored without generating
                row = RowOutput([], "length")
            else:
                c = self.choose(r, logits[i])
                row = RowOutput([c], r.stop_reason(c.token, 1))
            out.first[r.id] = row
            if row.finish is None:
                joining.append(r)
        return joining

    def _score(self, r: Request, logits: torch.Tensor, out: StepOutput) -> None:
        """Prompt logprobs from ``logits [n, V]`` of positions ``[r.n_fed, r.n_fed + n)``: each predicts
        the next prompt token (the last of the prompt predicts the first generated one: not scored)."""
        lo = r.n_fed
        nxt = torch.tensor(r.prompt_ids[lo + 1 : lo + 1 + logits.shape[0]], device=logits.device)  # [m]
        logp = torch.log_softmax(logits[: nxt.shape[0]], dim=-1)  # [m, V]
        out.prompt_logprobs[r.id] = logp.gather(1, nxt[:, None])[:, 0].tolist()
        k = r.params.prompt_logprobs
        if k and nxt.shape[0]:
            v, i = logp.topk(min(k, logp.shape[-1]), dim=-1)
            out.prompt_top[r.id] = [
                list(zip(a, b, strict=True)) for a, b in zip(i.tolist(), v.tolist(), strict=True)
            ]

    def choose(self, r: Request, logits: torch.Tensor) -> TokenChoice:
        """The token for ``logits [V]``: the argmax, or the request's processors and sampler."""
        if r.plain_greedy:
            return TokenChoice(int(torch.argmax(logits)))
        assert r.sampler is not None
        return sample(logits, r.sampler)

    def reset(self) -> None:
        """Drop the batch (a failed step, or closing)."""
        self.batch, self.rows = None, []

    def batch_bytes(self) -> int:
        return self.batch.nbytes() if self.batch is not None else 0
