"""Speculative decoding: a small draft model proposes ``k`` tokens, the target verifies them in one forward.

The draft model's layers live in the same ``Cache`` as the target's (``Speculator.new_cache``: the
target's layers, then the draft's, one ``seq_lens``), so the engine's batching (``select``, ``stack``,
``split``), byte accounting and prefix snapshots cover both without knowing about drafts. The target
model reads only its first ``n_layers`` layers; the draft runs on a view of the rest.

One decode step for a batch whose rows each end in their last token ``t``:

1. **draft**: ``k`` one-token steps propose ``d_1..d_k`` per row (greedy rows: the draft's argmax;
   sampled rows: a sample from the draft's processed distribution ``q``), and one more step feeds
   ``d_k``, so both models have consumed ``[t, d_1..d_k]``;
2. **verify**: the target reads ``[t, d_1..d_k]`` in one ``[B, k+1]`` forward, giving its distribution
   ``p_i`` after each prefix;
3. **accept** per row, in order: greedy rows keep ``d_i`` while it is the target's argmax and then emit
   the target's argmax (so the output is the target's greedy output, token for token); sampled rows
   keep ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` and on the first rejection emit a
   sample of ``norm(max(0, p_i - q_i))`` (standard speculative sampling: every emitted token is
   distributed as the target's ``p_i``). A row that keeps all ``k`` emits a bonus token from ``p_k``;
4. **rollback**: a row that kept ``n < k`` tokens must forget ``d_{n+1}..d_k``. MLA latents can be
   truncated, KDA states and conv tails cannot (a recurrent state has no per-token history), so the
   step takes a ``Cache.mark`` (copies of the recurrent layers) before drafting and **replays**:
   ``Cache.rewind`` returns the row to the mark, and one forward per distinct ``n`` feeds
   ``[t, d_1..d_n]`` again to both models. Rows that kept everything need nothing. A row that
   finishes leaves the batch as it is, unless its row lives on (a session's kept row or an
   end-of-request prefix snapshot, ``Request.keeps_row``): it is rolled back to all its tokens but
   the last, as any row after a step. (A row finished by a stop string, which only the output side
   sees, has consumed what the runner accepted: its row then is not kept; ``Scheduler.update``.)

Constrained rows (a grammar, a forced tool call: ``SamplingParams.constraint``): each proposal is
masked by the constraint in the state it would be read in (the constraint accepts the row's drafts
as they are proposed), then the drafts are rolled back (``TokenConstraint.rollback``) and the target's
tokens are masked and accepted one by one as without a draft, so a draft can only propose what the
grammar allows and the output is the target's. A draft that closes the document proposes the rest
unmasked (those tokens are never kept: the row finishes at the closing token).

Snapshot + replay was chosen over keeping per-position states of the verify pass because it needs no
change to the layers or operators; ``bench/serve.py`` measures what the replay costs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from longmoe.cache import Cache, CacheMark
from longmoe.model import LongMoE
from longmoe.serve.request import Request
from longmoe.serve.sampling import TokenChoice, process_logits, record_choice
from longmoe.serve.step import RowOutput


def accept_or_resample(
    p: torch.Tensor, q: torch.Tensor, token: int, generator: torch.Generator
) -> tuple[bool, int]:
    """Speculative sampling for one drafted ``token ~ q``: ``(True, token)`` with probability
    ``min(1, p[token] / q[token])``, else ``(False, t)`` with ``t ~ norm(max(0, p - q))``."""
    u = float(torch.rand((), generator=generator, device=p.device))
    if u * float(q[token]) < float(p[token]):
        return True, token
    resid = (p - q).clamp_min(0)
    if float(resid.sum()) <= 0:  # p == q up to rounding: any rejection is rounding noise
        resid = p
    return False, int(torch.multinomial(resid / resid.sum(), 1, generator=generator))


@dataclass
class SpecStats:
    steps: int = 0  # speculative decode steps
    rows: int = 0  # row-steps (one per running request per step)
    proposed: int = 0  # draft tokens verified
    accepted: int = 0  # ... that the target kept
    replayed_rows: int = 0  # row-steps that rolled back and replayed
    replay_s: float = 0.0  # wall time spent rolling back and replaying


class Speculator:
    """Draft-and-verify decoding of a batch (see the module docstring)."""

    def __init__(self, target: LongMoE, draft: LongMoE, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_speculative_tokens: expected an integer >= 1, got {k!r}")
        if draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(
                f"draft model: vocab_size {draft.cfg.vocab_size} differs from the target's "
                f"{target.cfg.vocab_size}; a draft must share the target's tokenizer"
            )
        if draft.cfg.vision is not None and draft.cfg.d_model != target.cfg.d_model:
            raise ValueError(
                f"draft model: has a vision encoder but d_model {draft.cfg.d_model} differs from the "
                f"target's {target.cfg.d_model}; it would read the target's image embeddings"
            )
        self.target, self.draft, self.k = target, draft.eval(), k
        self.n_target = target.cfg.n_layers
        self.stats = SpecStats()
        self.banned: torch.Tensor | None = None  # token ids neither model may propose (image tokens)

    def new_cache(self, batch_size: int, device: torch.device) -> Cache:
        """An empty cache holding the target's layers, then the draft's."""
        t, d = self.target.new_cache(batch_size, device), self.draft.new_cache(batch_size, device)
        return Cache(t.layers + d.layers, t.seq_lens)

    def _draft_view(self, cache: Cache) -> Cache:
        return Cache(cache.layers[self.n_target :], cache.seq_lens)

    def forward(
        self, x: torch.Tensor, cache: Cache, image_embeds: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Both models consume ``x [B, T]``; returns the target's logits ``[B, T, V]``.

        ``image_embeds`` (a prompt chunk with images, encoded by the target): a text-only draft reads
        the ``<|image_patch|>`` tokens as plain tokens (its own embedding of them), a draft with a
        vision encoder (``truncated_draft`` of a vision model) reads the target's embeddings. Either
        way only the acceptance rate can suffer: the target verifies every token."""
        draft_embeds = image_embeds if self.draft.cfg.vision is not None else None
        self.draft(x, cache=self._draft_view(cache), image_embeds=draft_embeds)
        return self.target(x, cache=cache, image_embeds=image_embeds).logits

    def _ban(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.banned is None else logits.index_fill(-1, self.banned, -torch.inf)

    def report(self) -> dict[str, float]:
        s = self.stats
        return {
            "spec_steps": s.steps,
            "spec_row_steps": s.rows,
            "spec_proposed": s.proposed,
            "spec_accepted": s.accepted,
            "spec_acceptance_rate": s.accepted / s.proposed if s.proposed else 0.0,
            "spec_tokens_per_row_step": (s.accepted + s.rows) / s.rows if s.rows else 0.0,
            "spec_replayed_rows": s.replayed_rows,
            "spec_replay_s": s.replay_s,
        }

    # ------------------------------------------------------------------ one decode step
    def step(self, reqs: Sequence[Request], cache: Cache) -> tuple[Cache, list[int], list[RowOutput]]:
        """Decode ``reqs`` (the rows of ``cache``, each ending in ``r.out[-1]``).

        Returns the batch cache afterwards, its row order (indices into ``reqs``) and each row's
        tokens (up to ``k + 1``, ending where the row finished: ``Request.stop_reason``)."""
        k, dev = self.k, cache.seq_lens.device
        mark = cache.mark()
        last = torch.tensor([[r.out[-1]] for r in reqs], dtype=torch.long, device=dev)  # [B, 1]
        view = self._draft_view(cache)
        qs: list[list[torch.Tensor]] = [[] for _ in reqs]
        ahead = [0] * len(reqs)  # drafts each row's constraint accepted (taken back before verifying)
        closed = [False] * len(reqs)  # the row's drafts closed its constraint (the rest goes unmasked)
        drafted: list[list[int]] = []
        x = last
        for j in range(k + 1):
            logits = self._ban(self.draft(x, cache=view).logits[:, 0].float())  # [B, V]
            if j < k:
                drafted.append(self._propose(reqs, logits, qs, ahead, closed))
                x = torch.tensor(drafted[-1], dtype=torch.long, device=dev)[:, None]
        for r, n in zip(reqs, ahead, strict=True):
            if n:
                assert r.sampler is not None and r.sampler.constraint is not None
                r.sampler.constraint.rollback(n)
        D = torch.tensor(drafted, dtype=torch.long, device=dev).T  # [B, k]
        target_logits = self._ban(
            self.target(torch.cat([last, D], dim=1), cache=cache).logits.float()
        )  # [B, k+1, V]
        argmax = target_logits.argmax(-1).tolist()  # [B][k+1]
        kept, rows = [], []
        for b, r in enumerate(reqs):
            row = RowOutput()
            accepted, judged = self._verify(r, target_logits[b], argmax[b], drafted, b, qs[b], row)
            rows.append(row)
            self.stats.accepted += accepted
            self.stats.proposed += judged
            # the row has consumed [t, d_1..d_k]; it must keep [t, new tokens but the last]: a running
            # row or a finished one that lives on; any other finished row leaves as it is (no rollback)
            alive = row.finish is None or r.lives_on
            kept.append(len(row.choices) - 1 if alive else k)
        self.stats.steps += 1
        self.stats.rows += len(reqs)
        cache, order = self._rollback(reqs, cache, mark, last, D, kept)
        return cache, order, rows

    def _propose(
        self,
        reqs: Sequence[Request],
        logits: torch.Tensor,
        qs: list[list[torch.Tensor]],
        ahead: list[int],
        closed: list[bool],
    ) -> list[int]:
        """One draft token per row from the draft's ``logits [B, V]``; sampled rows record ``q``.

        A constraint that can roll back accepts each proposal (``ahead``), so the next one is masked
        in the state after it; once the drafts close it (``closed``) the row's proposals are the raw
        argmax (``q`` one-hot: still a valid proposal for the acceptance test)."""
        toks = logits.argmax(-1).tolist()
        for b, r in enumerate(reqs):
            if r.plain_greedy:
                continue
            st = r.sampler
            assert st is not None
            c = st.constraint
            if closed[b]:
                if not r.params.greedy:
                    qs[b].append(
                        torch.zeros_like(logits[b]).index_fill_(
                            0, torch.tensor([toks[b]], device=logits.device), 1.0
                        )
                    )
                continue
            x = process_logits(logits[b], st)  # penalties as of the last accepted token
            if r.params.greedy:
                toks[b] = int(x.argmax())
            else:
                q = torch.softmax(x, dim=-1)
                toks[b] = int(torch.multinomial(q, 1, generator=st.generator))
                qs[b].append(q)
            if c is not None and hasattr(c, "rollback"):
                c.accept(toks[b])
                ahead[b] += 1
                closed[b] = c.done
        return toks

    def _verify(
        self,
        r: Request,
        logits: torch.Tensor,
        argmax: list[int],
        drafted: list[list[int]],
        b: int,
        qs: list[torch.Tensor],
        row: RowOutput,
    ) -> tuple[int, int]:
        """Row ``b``'s accepted tokens and the correction (or bonus) into ``row``, until it finishes.

        Returns ``(drafts accepted, drafts judged)``."""
        k = self.k
        for i in range(k + 1):
            d = drafted[i][b] if i < k else -1
            if r.plain_greedy:
                tok = argmax[i]
                choice = TokenChoice(tok)
            else:
                st = r.sampler
                assert st is not None
                x = process_logits(logits[i], st)  # penalties see the tokens accepted so far
                if r.params.greedy:
                    tok = int(x.argmax())
                elif i < k:
                    ok, tok = accept_or_resample(torch.softmax(x, dim=-1), qs[i], d, st.generator)
                else:
                    tok = int(torch.multinomial(torch.softmax(x, dim=-1), 1, generator=st.generator))
                choice = record_choice(tok, logits[i], st)
            row.choices.append(choice)
            row.finish = r.stop_reason(tok, len(r.out) + len(row.choices))
            if tok != d:
                return i, min(i + 1, k)
            if row.finish is not None:
                return i + 1, i + 1
        return k, k

    def _rollback(
        self,
        reqs: Sequence[Request],
        cache: Cache,
        mark: CacheMark,
        last: torch.Tensor,
        D: torch.Tensor,
        kept: list[int],
    ) -> tuple[Cache, list[int]]:
        k = self.k
        short = sorted({n for n in kept if n < k})
        if not short:
            return cache, list(range(len(reqs)))
        t0 = time.perf_counter()
        order = [b for b, n in enumerate(kept) if n == k]
        parts = [cache.select(order)] if order else []
        x_all = torch.cat([last, D], dim=1)  # [B, k+1]
        for n in short:
            rows = [b for b, m in enumerate(kept) if m == n]
            sub = cache.rewind(mark, rows)
            idx = torch.tensor(rows, dtype=torch.long, device=x_all.device)
            self.forward(x_all.index_select(0, idx)[:, : n + 1], sub)
            parts.append(sub)
            order += rows
        self.stats.replayed_rows += len(reqs) - kept.count(k)
        self.stats.replay_s += time.perf_counter() - t0
        return Cache.stack(parts), order


def truncated_draft(model: LongMoE, n_layers: int) -> LongMoE:
    """A draft made of ``model``'s first ``n_layers`` layers (embeddings, head and norms shared by copy).

    Costs no training; its acceptance rate says how much the later layers change the prediction.
    """
    if not 1 <= n_layers <= model.cfg.n_layers:
        raise ValueError(f"n_layers: expected 1..{model.cfg.n_layers}, got {n_layers}")
    blocks = min(model.cfg.attn_res_blocks, n_layers)
    pattern = "".join(model.cfg.layer_types[:n_layers])  # the same kind of layer at every index
    draft = LongMoE(model.cfg.replace(n_layers=n_layers, layer_pattern=pattern, attn_res_blocks=blocks))
    own = model.state_dict()
    sd = {}
    for name, t in draft.state_dict().items():
        src = own[name]
        sd[name] = src if src.shape == t.shape else src[tuple(slice(0, n) for n in t.shape)]
    draft.load_state_dict(sd)
    return draft.to(next(model.parameters()).device).eval()
