"""Prompt scoring as an engine request (``SamplingParams.prompt_logprobs``): the prompt is prefilled
with every position's logits in the engine's own steps, beside other requests, and the scores equal
``serve/scoring.score_prompt`` (a full forward's log-softmax, its reference)."""

from __future__ import annotations

import pytest
import torch

from longmoe.serve.sampling import SamplingParams
from longmoe.serve.scoring import score_prompt
from tests.helpers.models import VOCAB, tiny_model

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def ids_of(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.mark.parametrize("chunk", [5, 512])
def test_engine_scores_equal_the_reference(make_engine, model, chunk):
    ids = ids_of(23, 0)
    ref = score_prompt(model, ids, top_k=3)
    with make_engine(model, prefill_chunk=chunk) as e:
        c = e.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=3))
    assert c.token_ids == [] and c.finish_reason == "length" and c.cached_tokens == 0
    assert c.prompt_logprobs[0] is None and c.prompt_top_logprobs[0] is None
    assert len(c.prompt_logprobs) == len(ids)
    assert max(abs(a - b) for a, b in zip(c.prompt_logprobs[1:], ref.token_logprobs[1:], strict=True)) < 1e-4
    for got, want in zip(c.prompt_top_logprobs[1:], ref.top_logprobs[1:], strict=True):
        assert [t for t, _ in got] == [t for t, _ in want]


def test_scoring_beside_generation_changes_nothing(make_engine, model):
    """A scored request that also generates, submitted with plain ones: every output is what it is
    alone, and the scores are the reference's (the scored prompt is a chunk of its own)."""
    prompts = [ids_of(40, s) for s in range(3)]
    with make_engine(model, prefill_chunk=16) as e:
        alone = [e.generate(p, GREEDY).token_ids for p in prompts]
        first = e.generate(prompts[0], GREEDY)  # a snapshot of prompt 0 is stored: scoring must not use it
        assert first.cached_tokens > 0
        scored = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
        hs = [e.submit(prompts[0], scored), *(e.submit(p, GREEDY) for p in prompts[1:])]
        out = [h.result() for h in hs]
    assert [c.token_ids for c in out] == alone
    assert out[0].cached_tokens == 0 and out[0].prompt_top_logprobs is None
    ref = score_prompt(model, prompts[0])
    assert (
        max(abs(a - b) for a, b in zip(out[0].prompt_logprobs[1:], ref.token_logprobs[1:], strict=True))
        < 1e-4
    )
    assert all(c.prompt_logprobs is None for c in out[1:])


def test_max_tokens_zero_needs_scoring():
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(max_tokens=0, prompt_logprobs=-1)
