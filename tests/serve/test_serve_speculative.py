"""Speculative decoding: greedy output identical to plain decoding (many prompts, k in {1, 3, 5},
batched rows with different acceptance lengths), the rejection-sampling correction keeps the target
distribution (chi-square, with a check that a wrong correction fails it), sampled engine output
matches the target's exact joint of two speculated tokens (also after a prefix hit and under a
grammar), stats and validation. ``test_serve_spec_matrix.py`` crosses it with every other feature."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from longmoe.model import LongMoE
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.sampling import SamplerState, SamplingParams, process_logits
from longmoe.serve.speculative import accept_or_resample, truncated_draft
from longmoe.serve.structured import JsonFormat, JsonGrammars
from tests.helpers.models import VOCAB, tiny_model

# chi-square critical values at p = 0.001 by degrees of freedom (a correct sampler fails 1 in 1000)
CHI2_999 = {
    1: 10.83,
    2: 13.82,
    3: 16.27,
    4: 18.47,
    5: 20.52,
    6: 22.46,
    7: 24.32,
    8: 26.12,
    9: 27.88,
    10: 29.59,
    11: 31.26,
    12: 32.91,
    13: 34.53,
    14: 36.12,
    15: 37.70,
    16: 39.25,
    17: 40.79,
    18: 42.31,
    19: 43.82,
    20: 45.31,
    21: 46.80,
    22: 48.27,
    23: 49.73,
    24: 51.18,
    25: 52.62,
    26: 54.05,
    27: 55.48,
    28: 56.89,
    29: 58.30,
    30: 59.70,
}


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def noisy_copy(model: LongMoE, scale: float, seed: int = 1, head_only: bool = False) -> LongMoE:
    """A draft that agrees with the target often but not always (noise on every weight, or only on
    the LM head: the random tiny model is so flat that small noise everywhere reorders its top tokens)."""
    torch.manual_seed(seed)
    d = LongMoE(model.cfg)
    d.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, p in d.named_parameters():
            if not head_only or name.startswith("lm_head"):
                p.add_(torch.randn_like(p) * scale)
    return d.eval()


@pytest.fixture(scope="module")
def target() -> LongMoE:
    return tiny_model()


@pytest.fixture(scope="module")
def engine(make_engine):
    """``engine(target, draft=None, **fields)``: the module's engines, 32-token prefill chunks."""
    return lambda target, draft=None, **kw: make_engine(target, draft, **{"prefill_chunk": 32, **kw})


def chi2(counts: dict[int, int], probs: dict[int, float], n: int) -> tuple[float, int]:
    """Pearson's statistic over cells with expected count >= 5 (the rest pooled); (stat, dof)."""
    cells, rest_o, rest_e = [], 0, 0.0
    for t, p in probs.items():
        e = p * n
        if e >= 5:
            cells.append((counts.get(t, 0), e))
        else:
            rest_o, rest_e = rest_o + counts.get(t, 0), rest_e + e
    rest_o += sum(c for t, c in counts.items() if t not in probs)
    if rest_e >= 5 or rest_o:
        cells.append((rest_o, max(rest_e, 1e-9)))
    return sum((o - e) ** 2 / e for o, e in cells), len(cells) - 1


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_identical_over_many_prompts(engine, target, k):
    prompts = [ids(3 + 7 * i, i) for i in range(10)]
    params = [SamplingParams(max_tokens=12 + (i % 4), temperature=0.0, ignore_eos=True) for i in range(10)]
    with engine(target) as plain:
        ref = [c.token_ids for c in plain.generate_batch(prompts, params)]
    with engine(target, draft=noisy_copy(target, 0.02, head_only=True), num_speculative_tokens=k) as e:
        got = [c.token_ids for c in e.generate_batch(prompts, params)]
    s = e.stats()  # after close: the engine thread finished its last step
    assert got == ref
    assert 0 < s["spec_accepted"] < s["spec_proposed"]  # partial acceptance: both paths ran
    assert s["spec_replayed_rows"] > 0


def test_greedy_identical_with_a_smaller_draft_and_penalties(engine, target):
    prompts = [ids(5 + 11 * i, 50 + i) for i in range(6)]
    params = [
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, repetition_penalty=1.3),
        SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, frequency_penalty=0.5, logprobs=True),
    ] * 2
    with engine(target) as plain:
        ref = plain.generate_batch(prompts, params)
    for draft in (truncated_draft(target, 2), tiny_model(seed=3, n_layers=2, layer_pattern="LM", d_model=64)):
        with engine(target, draft=draft, num_speculative_tokens=3) as e:
            got = e.generate_batch(prompts, params)
        assert [c.token_ids for c in got] == [c.token_ids for c in ref]
        for a, b in zip(got, ref, strict=True):
            if b.logprobs is not None:
                assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_identical_draft_accepts_everything(engine, target):
    with engine(target, draft=noisy_copy(target, 0.0), num_speculative_tokens=4) as e:
        c = e.generate(ids(20, 7), SamplingParams(max_tokens=21, temperature=0.0, ignore_eos=True))
    s = e.stats()  # after close: the engine thread finished its last step
    assert c.completion_tokens == 21
    assert s["spec_acceptance_rate"] == 1.0 and s["spec_replayed_rows"] == 0
    assert s["spec_steps"] == 4  # 1 token from prefill, then 5 per step


def _sampled_tokens(p: torch.Tensor, q: torch.Tensor, n: int, correct: bool) -> list[int]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        d = int(torch.multinomial(q, 1, generator=g))
        if correct:
            out.append(accept_or_resample(p, q, d, g)[1])
        else:  # a plausible mistake: resample from p itself after a rejection
            ok = float(torch.rand((), generator=g)) * float(q[d]) < float(p[d])
            out.append(d if ok else int(torch.multinomial(p, 1, generator=g)))
    return out


def test_rejection_sampling_keeps_the_target_distribution():
    p = torch.tensor([0.05, 0.30, 0.10, 0.25, 0.20, 0.10])
    q = torch.tensor([0.30, 0.05, 0.20, 0.05, 0.10, 0.30])
    n = 6000
    probs = dict(enumerate(p.tolist()))
    for correct in (True, False):
        toks = _sampled_tokens(p, q, n, correct)
        counts = {t: toks.count(t) for t in set(toks)}
        stat, dof = chi2(counts, probs, n)
        if correct:
            assert stat < CHI2_999[dof], stat
        else:  # the test has the power to catch a wrong correction
            assert stat > 5 * CHI2_999[dof], stat


ARRAY = {"type": "array", "items": {"type": "integer"}, "minItems": 1}  # '[' then digits: a small support


@pytest.mark.parametrize("variant", ["plain", "prefix_hit", "grammar"])
def test_sampled_engine_output_has_the_target_distribution(make_engine, target, tok, variant):
    """Tokens 2 and 3 of each completion come from one speculative step: their joint over many seeds
    must be the target's exact ``sum_t1 p(t1) p(t2 | t1) p(t3 | t1 t2)`` (top-k 3 keeps the support
    small); also when the prompt is restored from a prefix snapshot, and under a JSON grammar (the
    draft's proposals masked by it and rolled back before the target's tokens are accepted)."""
    prompt = ids(9, 123)
    constraint = JsonGrammars(tok, VOCAB).constraint(JsonFormat(ARRAY)) if variant == "grammar" else None
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True, constraint=constraint)

    def dist(prefix: list[int]) -> torch.Tensor:
        st = SamplerState(params, prompt, VOCAB, "cpu")
        for t in prefix:
            st.observe(t)  # the grammar's state after the tokens so far
        with torch.no_grad():
            logits = target(torch.tensor([prompt + prefix])).logits[0, -1].float()
        return torch.softmax(process_logits(logits, st), -1)

    joint: dict[tuple[int, int], float] = {}
    p1 = dist([])
    for t1 in p1.nonzero().flatten().tolist():
        p2 = dist([t1])
        for t2 in p2.nonzero().flatten().tolist():
            p3 = dist([t1, t2])
            for t3 in p3.nonzero().flatten().tolist():
                joint[t2, t3] = joint.get((t2, t3), 0.0) + float(p1[t1] * p2[t2] * p3[t3])
    n = 600
    seeded = [dataclasses.replace(params, seed=s) for s in range(n)]
    draft = noisy_copy(target, 0.02, head_only=True)
    block = {"prefix_block_size": 4} if variant == "prefix_hit" else {"prefix_cache": False}
    with make_engine(target, draft, prefill_chunk=1024, max_batch=64, num_speculative_tokens=3, **block) as e:
        outs = e.generate_batch([prompt] * n, seeded)
    s = e.stats()  # after close: the engine thread finished its last step
    assert 0 < s["spec_accepted"] < s["spec_proposed"]
    if variant == "prefix_hit":
        assert s["prefix_hits"] > n // 2
    pairs = [(c.token_ids[1], c.token_ids[2]) for c in outs]
    cells = {key: i for i, key in enumerate(joint)}
    counts = {cells.get(pr, -1): pairs.count(pr) for pr in set(pairs)}
    stat, dof = chi2(counts, {cells[key]: p for key, p in joint.items()}, n)
    assert stat < CHI2_999[dof], (stat, dof)


def test_seeds_reproduce_with_speculation(engine, target):
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=42, ignore_eos=True)
    with engine(target, draft=noisy_copy(target, 0.02, head_only=True), num_speculative_tokens=3) as e:
        a = e.generate(ids(10, 1), params).token_ids
        b = e.generate_batch([ids(10, 1), ids(30, 2)], params)[0].token_ids
    assert a == b and len(a) == 12


def test_validation_and_from_dir(make_engine, tmp_path, tok):
    with pytest.raises(ValueError, match="vocab_size"):  # what Engine's constructor refuses: built here
        Engine(tiny_model(), tok, draft=tiny_model(vocab_size=VOCAB + 8))
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(num_speculative_tokens=0)
    draft_dir = tmp_path / "draft"
    tiny_model(seed=5, n_layers=4).save_pretrained(draft_dir)
    tok.save(draft_dir)
    with make_engine(draft_model=str(draft_dir), num_speculative_tokens=2) as e:
        assert e.speculator is not None and e.speculator.k == 2
        assert e.generate("import os", SamplingParams(max_tokens=5, temperature=0.0)).finish_reason in (
            "length",
            "stop",
        )
    with pytest.raises(ValueError, match="n_layers"):
        truncated_draft(tiny_model(), 0)


def test_a_finished_row_stored_as_a_prefix_snapshot_was_rolled_back(engine, target):
    """A row that finishes on a rejected draft has consumed that draft: its end-of-request snapshot
    must be rolled back to the tokens it names, or the next turn (prompt + reply + more) continues a
    wrong state. The seeds below finish on such a step."""
    draft = noisy_copy(target, 0.02, head_only=True)
    full_hits = 0
    for s, m in [(3, 6), (24, 9), (25, 10), (55, 4)]:
        prompt = ids(20, 300 + s)
        p = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        with engine(target, draft=draft, num_speculative_tokens=3) as e:
            first = e.generate(prompt, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
            nxt = prompt + first.token_ids + ids(5, 200 + s)
            got = e.generate(nxt, p)
        with engine(target, prefix_cache=False) as plain:
            ref = plain.generate(nxt, p)
        assert got.token_ids == ref.token_ids, (s, m)
        full_hits += got.cached_tokens == len(prompt) + m - 1
    assert full_hits  # the next turn reused the end snapshot
