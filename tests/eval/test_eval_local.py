"""The local path on a random-init tiny model: engine vs an argmax loop, prompts past the window, ppl."""

from __future__ import annotations

import json

import pytest
import torch

from longmoe.cli import main
from longmoe.eval.clients import LocalClient
from longmoe.eval.ppl import position_losses, ppl_by_position
from longmoe.model import LongMoE
from longmoe.presets import preset
from longmoe.tasks import generate
from tests.helpers.tokenizer import tokenizer_for_tests

WINDOW = 512


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    tok = tokenizer_for_tests(512)
    cfg = preset("tiny").replace(vocab_size=tok.vocab_size, n_layers=4, max_seq_len=WINDOW)
    d = tmp_path_factory.mktemp("tiny")
    LongMoE(cfg).save_pretrained(d)
    tok.save(d / "tokenizer.json")
    return d


@torch.no_grad()
def argmax_loop(model, tok, prompt: str, max_tokens: int) -> str:
    """Oracle: full-sequence forward per token (no cache, no engine), greedy, first line."""
    ids = tok.encode(prompt, bos=True)
    out: list[int] = []
    for _ in range(max_tokens):
        t = int(model(torch.tensor([ids + out])).logits[0, -1].float().argmax())
        if t in (tok.eos_id, tok.end_id, tok.pad_id):
            break
        out.append(t)
        if "\n" in tok.decode(out):
            break
    return tok.decode(out, skip_special_tokens=True).split("\n", 1)[0]


def test_engine_matches_a_plain_argmax_loop(model_dir):
    client = LocalClient(model_dir)
    model = LongMoE.from_pretrained(model_dir).eval()
    items = generate("niah_single", 2, 256, seed=0, tokenizer=client.tokenizer)
    prompts = [it.prompt() for it in items]
    replies = client.complete_batch(prompts, [6, 6])
    for p, r in zip(prompts, replies):
        assert r.text == argmax_loop(model, client.tokenizer, p, 6)
        assert r.prompt_tokens == len(client.tokenizer.encode(p, bos=True))
        assert "\n" not in r.text and 1 <= r.completion_tokens <= 6
    client.close()


def test_prompts_past_the_window_are_answered(model_dir):
    """max_seq_len is the training window, not a limit: eval past it is the extrapolation test."""
    client = LocalClient(model_dir)
    assert client.engine.max_context > 4 * WINDOW
    model = LongMoE.from_pretrained(model_dir).eval()
    long_item = generate("niah_single", 1, 2 * WINDOW, seed=0, tokenizer=client.tokenizer)[0]
    short_item = generate("niah_single", 1, WINDOW // 2, seed=0, tokenizer=client.tokenizer)[0]
    replies = client.complete_batch([long_item.prompt(), short_item.prompt()], [4, 4])
    assert replies[0].prompt_tokens > WINDOW >= replies[1].prompt_tokens
    assert replies[0].text == argmax_loop(model, client.tokenizer, long_item.prompt(), 4)
    client.close()


def test_position_losses_are_chunk_invariant(model_dir):
    model = LongMoE.from_pretrained(model_dir).eval()
    tok = tokenizer_for_tests(512)
    ids = generate("recall", 1, 700, seed=2, tokenizer=tok)[0].to_text()
    ids = tok.encode(ids, bos=True)[:700]
    a = position_losses(model, ids, chunk=97)
    b = position_losses(model, ids, chunk=4096)
    assert a.shape == (699,)
    torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4)
    with torch.no_grad():
        x = torch.tensor([ids])
        ce = model(x[:, :-1], labels=x[:, 1:]).ce_loss
    assert float(a.mean()) == pytest.approx(float(ce), abs=1e-4)


def test_ppl_by_position_buckets(model_dir):
    model = LongMoE.from_pretrained(model_dir).eval()
    tok = tokenizer_for_tests(512)
    res = ppl_by_position(model, tok, max_len=1024, window=256, n_docs=1, bucket=128)
    assert [b["start"] for b in res["buckets"]] == list(range(1, 1024, 128))
    assert res["buckets"][-1]["end"] == 1023
    assert res["n_docs"] == 1 and res["beyond"] == res["beyond"]
    assert 4.0 < res["inside"] < 9.0, "random init: loss near log(vocab)=6.2"


def test_cli_local_model_with_ppl(model_dir, tmp_path):
    out = tmp_path / "ev"
    argv = ["eval", "--model", str(model_dir), "--tasks", "niah,multihop", "--lengths", "256,768"]
    argv += ["--depths", "2", "--n", "1", "--out", str(out), "--no-progress", "--ppl-by-position"]
    argv += ["--ppl-max-len", "1024", "--ppl-window", "512", "--ppl-docs", "1"]
    assert main(argv) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {r["length"] for r in rows} == {256, 768}
    ppl = json.loads((out / "ppl.json").read_text())
    assert ppl["window"] == 512 and ppl["max_len"] == 1024
    for name in ("heatmap_niah.png", "heatmap_multihop.png", "accuracy_vs_length.png", "ppl_by_position.png"):
        assert (out / "plots" / name).stat().st_size > 2000


def test_answer_loss_is_the_loss_of_the_answer_tokens(model_dir):
    from longmoe.eval.ppl import answer_loss

    model = LongMoE.from_pretrained(model_dir).eval()
    tok = tokenizer_for_tests(512)
    item = generate("niah_single", 1, 256, seed=3, tokenizer=tok)[0]
    p_ids = tok.encode(item.prompt(), bos=True)
    a_ids = tok.encode(" " + item.answer_text())
    with torch.no_grad():
        logits = model(torch.tensor([p_ids + a_ids])).logits[0].float()
    ref = torch.nn.functional.cross_entropy(logits[len(p_ids) - 1 : -1], torch.tensor(a_ids))
    assert answer_loss(model, tok, item.prompt(), item.answer_text()) == pytest.approx(float(ref), abs=1e-4)
