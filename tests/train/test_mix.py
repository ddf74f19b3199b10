"""The training mix's synthetic source: task documents from longmoe.tasks, answer-only targets."""

from __future__ import annotations

import pytest

from longmoe.config import IGNORE_INDEX
from longmoe.data.packing import Packer
from longmoe.train.mix import SYNTHETIC_TASKS, make_source

FAMILIES = ("niah", "multihop", "conflict", "recall")


def test_synthetic_tasks_are_the_registry_families():
    """The mix's task list is derived from the one registry in longmoe.tasks, in its order."""
    assert SYNTHETIC_TASKS == FAMILIES


def test_training_mix_renders_synthetic_documents(tok):
    src = make_source("synthetic", "train", 0, tok, synthetic_length=512)
    docs = [src.next() for _ in range(4)]
    assert [d.source.split(":")[1] for d in docs] == list(FAMILIES)
    for d in docs:
        assert "\nQuestion: " in d.text and "\nAnswer: " in d.text
        n = len(tok.encode(d.text)) + 2  # + bos, eos: the whole document fits one packed window
        assert 0.35 * 512 <= n < 512, n


def test_answer_only_training_documents_target_the_answer(tok):
    """With synthetic_loss="answer" a packed task document's only targets are its answer and eos."""
    src = make_source("synthetic", "train", 0, tok, synthetic_length=512, synthetic_loss="answer")
    ref = make_source("synthetic", "train", 0, tok, synthetic_length=512)
    p = Packer(src, tok.encode, tok.bos_id, tok.eos_id)
    for _ in range(len(FAMILIES)):
        doc = ref.next()
        answer = doc.text.rsplit("\nAnswer:", 1)[1]  # " 4829371\n"
        head, tail = tok.encode(doc.text[: len(doc.text) - len(answer)]), tok.encode(answer)
        w = p.next_window(len(head) + len(tail) + 2)  # exactly this one document, bos to eos
        assert w.input_ids == [tok.bos_id, *head, *tail, tok.eos_id]
        assert [t for t in w.labels if t != IGNORE_INDEX] == [*tail, tok.eos_id]
    with pytest.raises(ValueError, match="synthetic loss='x' is invalid"):
        make_source("synthetic", "train", 0, tok, synthetic_loss="x")
