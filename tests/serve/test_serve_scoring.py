"""Prompt scoring (serve/scoring.py): per-token log-probs of a prompt, chunked through the cache, equal
one full forward's log-softmax (to 1e-4: decode steps take the recurrent path)."""

from __future__ import annotations

import pytest
import torch

from longmoe.serve.scoring import score_prompt
from tests.helpers.models import VOCAB, tiny_model


@pytest.mark.parametrize("chunk", [1, 5, 512])
def test_scores_equal_one_full_forward(chunk):
    model = tiny_model()
    ids = torch.randint(0, VOCAB, (23,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # [T, V]
    s = score_prompt(model, ids, top_k=3, chunk=chunk)
    assert s.token_logprobs[0] is None and s.top_logprobs[0] is None
    want = [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(s.token_logprobs[1:], want, strict=True)) < 1e-4
    for t in range(1, len(ids)):
        v, i = logp[t - 1].topk(3)
        assert [a for a, _ in s.top_logprobs[t]] == i.tolist()
        assert max(abs(b - float(c)) for (_, b), c in zip(s.top_logprobs[t], v, strict=True)) < 1e-4
    assert torch.allclose(s.next_logprobs, logp[-1], atol=1e-4)


def test_one_token_and_bad_arguments():
    model = tiny_model()
    s = score_prompt(model, [5])
    assert s.token_logprobs == [None] and s.top_logprobs is None
    with pytest.raises(ValueError, match="at least one"):
        score_prompt(model, [])
