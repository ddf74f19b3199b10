"""Recall in long rows, read at the answer positions only: the chunked readout equals the full forward
at every pattern (a last MLA layer attended from the answers alone, a last KDA layer run through), with
the conv control across chunk borders and with log-length scaling; the entropy is the attention's."""

from __future__ import annotations

import math

import pytest
import torch

from longmoe.config import IGNORE_INDEX
from longmoe.pipelines.mqar.long_eval import answer_logits, recall
from longmoe.pipelines.mqar.model import build, model_config
from longmoe.tasks.mqar import placed

VOCAB = 64


def _model(pattern: str, position: str = "none", logn: float = 0.0, seed: int = 0):
    torch.manual_seed(seed)
    model, trained = build(model_config(pattern, 32, VOCAB, 512, False, 0.3, logn), position)
    return model.eval(), trained


@pytest.mark.parametrize(
    ("pattern", "position", "logn"),
    [("L", "none", 0.0), ("LM", "none", 0.0), ("LM", "none", 0.4), ("LLLM", "none", 0.4),
     ("M", "conv", 0.0), ("M", "conv", 0.4)],
)  # fmt: skip
@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_answer_logits_equal_the_full_forward_there(pattern, position, logn, chunk):
    model, _ = _model(pattern, position, logn)
    ids = torch.randint(0, VOCAB, (2, 150))
    pos = torch.tensor([[0, 6, 7, 63, 149], [20, 21, 100, 140, 148]])
    with torch.no_grad():
        full = model(ids).logits
    r = answer_logits(model, ids, pos, chunk)
    want = torch.stack([full[b, pos[b]] for b in range(2)])
    assert (r.logits - want).abs().max() < 1e-4
    assert (r.entropy is None) == (pattern == "L")
    if r.entropy is not None:  # query t over t + 1 keys: 0 <= H <= ln(t + 1)
        assert (r.entropy >= -1e-6).all() and (r.entropy <= torch.log1p(pos.double())[:, None] + 1e-4).all()
        assert float(r.entropy[0, :, 0].abs().max()) < 1e-6, "one key seen: zero entropy"


def test_recall_scores_answers_only_and_matches_the_full_forward():
    model, _ = _model("LM", seed=1)
    b = placed(seed=3, n=3, vocab_size=VOCAB, seq_len=300, n_pairs=8, placement="uniform", block_len=64)
    r = recall(model, b, chunk=50)
    with torch.no_grad():
        pred = model(b.input_ids).logits.argmax(-1)
    mask = b.labels != IGNORE_INDEX
    assert r.answers == 24 and r.correct == int((pred == b.labels)[mask].sum())
    assert r.entropy is not None and 0 <= r.entropy <= math.log(300)


def test_bad_calls_name_the_problem():
    model, _ = _model("LM")
    ids = torch.randint(0, VOCAB, (1, 20))
    with pytest.raises(ValueError, match="positions"):
        answer_logits(model, ids, torch.tensor([[20]]))
    with pytest.raises(ValueError, match="chunk"):
        answer_logits(model, ids, torch.tensor([[3]]), chunk=0)


@pytest.mark.slow(wall="~40 s on 2 shared cores")
@pytest.mark.parametrize(("pattern", "position"), [("LLLM", "none"), ("M", "conv")])
def test_answer_logits_equal_the_full_forward_at_64k(pattern, position):
    """At a long length, in the recipe's chunk size, with log-length scaling: still the full forward."""
    model, _ = _model(pattern, position, 0.24, seed=2)
    ids = torch.randint(0, VOCAB, (1, 65536))
    pos = torch.tensor([[5, 4096, 8191, 8192, 65535]])
    with torch.no_grad():
        full = model(ids).logits[0, pos[0]]
    assert (answer_logits(model, ids, pos, 8192).logits[0] - full).abs().max() < 1e-3
