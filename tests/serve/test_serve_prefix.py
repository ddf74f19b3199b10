"""Prefix reuse: identical outputs with and without snapshots at every alignment, concurrent groups
share one prefill, eviction under memory pressure, no leakage between prompts (even when their block
hashes collide), stored snapshots never change, stats."""

from __future__ import annotations

import random

import pytest
import torch

from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from tests.helpers.models import VOCAB
from tests.helpers.server import wait_idle

BS = 8
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.9, seed=7, ignore_eos=True)


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, VOCAB) for _ in range(n)]


@pytest.fixture(scope="module")
def plain(make_engine):
    return make_engine(prefill_chunk=16, prefix_cache=False)


@pytest.fixture(scope="module")
def reuse_engine(make_engine):
    """``reuse_engine(**fields)``: an engine with the prefix cache on ``BS``-token blocks."""
    return lambda **kw: make_engine(**{"prefill_chunk": 16, "prefix_block_size": BS, **kw})


def test_outputs_identical_for_hits_at_every_alignment(reuse_engine, plain):
    base = ids(40, 0)
    with reuse_engine(prefill_chunk=BS) as e:  # chunk ends (snapshots) at every block
        assert e.generate(base, GREEDY).token_ids == plain.generate(base, GREEDY).token_ids
        assert e.stats()["prefix_snapshots"] > 0
        for shared in range(2 * BS + 1, 3 * BS + 1):  # every prefix length mod the block size
            for n_tail, params in ((1, GREEDY), (5, SAMPLED)):
                prompt = base[:shared] + ids(n_tail, shared)
                before = e.stats()["prefix_tokens_reused"]
                got = e.generate(prompt, params).token_ids
                assert got == plain.generate(prompt, params).token_ids, (shared, n_tail)
                reused = e.stats()["prefix_tokens_reused"] - before
                assert reused == min(shared, len(prompt) - 1) // BS * BS  # clamped to a snapshot boundary
        s = e.stats()
        assert s["prefix_hits"] == 16 and s["prefix_lookups"] == 17


def test_multi_turn_and_shared_system_prompt_hit(reuse_engine, plain):
    system = ids(3 * BS + 3, 1)
    with reuse_engine() as e:
        turn1 = system + ids(5, 2)
        out1 = e.generate(turn1, GREEDY).token_ids
        turn2 = turn1 + out1 + ids(4, 3)  # the next turn extends the whole conversation
        assert e.generate(turn2, GREEDY).token_ids == plain.generate(turn2, GREEDY).token_ids
        # the first turn's end was kept: the second prefills only what is new since then
        assert e.stats()["prefix_tokens_reused"] == len(turn1) + len(out1) - 1
        other = system + ids(6, 4)  # another user, same system prompt
        assert e.generate(other, GREEDY).token_ids == plain.generate(other, GREEDY).token_ids
        assert e.stats()["prefix_hits"] == 2


def test_concurrent_group_computes_the_prefix_once(reuse_engine, plain):
    task = ids(5 * BS + 2, 5)
    G = 4
    params = [SamplingParams(max_tokens=5, temperature=1.0, seed=s, ignore_eos=True) for s in range(G)]
    with reuse_engine() as e:
        got = [c.token_ids for c in e.generate_batch([task] * G, params)]
        s = e.stats()
    assert got == [c.token_ids for c in plain.generate_batch([task] * G, params)]
    assert s["prefix_hits"] == G - 1
    assert s["prefix_tokens_reused"] == (G - 1) * (len(task) - 1) // BS * BS


def test_eviction_under_pressure_and_budget_accounting(reuse_engine):
    with reuse_engine() as probe:
        need = probe.budget.spec.bytes_for(200, probe.budget.block_size)
    budget = 2 * need
    with reuse_engine(cache_budget_bytes=budget) as e:
        for i in range(6):  # distinct long prompts fill the free bytes with snapshots
            e.generate(ids(150, 10 + i), SamplingParams(max_tokens=2, temperature=0.0))
            assert e.budget.snapshot_bytes + e.budget.reserved_bytes <= budget
        assert e.stats()["prefix_evictions"] > 0
        # a request needing nearly the whole budget is admitted at once: snapshots make room
        n_alone = e.budget.max_tokens_alone()
        big = SamplingParams(max_tokens=n_alone - 150, temperature=0.0, ignore_eos=True)
        assert e.budget.snapshot_bytes + e.budget.spec.bytes_for(n_alone, e.budget.block_size) > budget
        evicted = e.stats()["prefix_evictions"]
        c = e.generate(ids(150, 99), big)
        assert (c.finish_reason, c.completion_tokens) == ("length", big.max_tokens)
        assert e.stats()["prefix_evictions"] > evicted
        assert e.budget.snapshot_bytes + e.budget.reserved_bytes <= budget


def test_colliding_hashes_never_share_state(reuse_engine, plain):
    with reuse_engine() as e:
        assert e.prefix is not None
        e.prefix.hash_fn = lambda parent, tokens: b"same"  # every block of every prompt collides
        a, b = ids(30, 20), ids(30, 21)
        e.generate(a, GREEDY)
        assert e.stats()["prefix_snapshots"] > 0
        assert e.generate(b, GREEDY).token_ids == plain.generate(b, GREEDY).token_ids
        assert e.stats()["prefix_hits"] == 0  # b's blocks hash like a's, but its tokens differ


def test_reusing_a_snapshot_never_changes_it(reuse_engine, plain):
    with reuse_engine() as e:
        base = ids(33, 30)
        e.generate(base, GREEDY)
        assert e.prefix is not None
        wait_idle(e)  # the engine thread stores a finished request's snapshot after its result is out
        before = {k: [t.clone() for t in tensors(n)] for k, n in e.prefix.nodes.items()}
        for tail in range(3):
            e.generate(base + ids(4, tail), SAMPLED)
        assert wait_idle(e)["prefix_hits"] == 3
        for k, old in before.items():
            assert all(torch.equal(x, y) for x, y in zip(old, tensors(e.prefix.nodes[k]), strict=True))
        again = base + ids(4, 0)
        assert e.generate(again, GREEDY).token_ids == plain.generate(again, GREEDY).token_ids


def tensors(node) -> list[torch.Tensor]:
    states = [s for s in node.latents if s is not None]
    states += [s for p in sorted(node.points) for s in node.points[p] if s is not None]
    return [t for s in states for t in vars(s).values() if isinstance(t, torch.Tensor)]


def other(t: int) -> int:
    return 3 + (t - 3 + 1) % (VOCAB - 3)


def test_hits_reach_within_one_chunk_of_the_shared_prefix_at_every_offset(make_engine, plain):
    """Default blocks (16 = the KDA chunk): a prompt sharing ``p`` tokens with a stored one (any ``p``,
    in the middle of a prefill chunk) restores a multiple of 16 in ``(p - 16, p]``; outputs unchanged."""
    base = ids(140, 40)
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    prompts = [base[:p] + [other(base[p])] for p in range(129)]
    with make_engine(prefix_cache=False, prefill_chunk=8192) as e:
        want = [c.token_ids for c in e.generate_batch(prompts, params)]
    with make_engine() as e:  # prefill_chunk 512: the states come from inside the chunk
        e.generate(base, params)
        got = [e.generate(p, params) for p in prompts]  # one by one: each hits the base's snapshots
    assert [c.token_ids for c in got] == want
    for p, c in enumerate(got):
        assert c.cached_tokens % 16 == 0 and p - 15 <= c.cached_tokens <= p, (p, c.cached_tokens)


def test_a_prompt_differing_at_one_token_never_gets_state_past_it(make_engine, plain):
    base = ids(100, 41)
    with make_engine() as e:
        e.generate(base, GREEDY)
        for i in (0, 5, 15, 16, 17, 40, 63, 64, 98):
            prompt = base[:i] + [other(base[i])] + base[i + 1 :]
            c = e.generate(prompt, GREEDY)
            assert c.cached_tokens <= i and c.cached_tokens >= i - 15, (i, c.cached_tokens)
            assert c.token_ids == plain.generate(prompt, GREEDY).token_ids


def test_short_prompts_hit(make_engine, plain):
    with make_engine() as e:
        e.generate(ids(20, 42), GREEDY)
        prompt = ids(20, 42)[:17] + [1, 2]
        c = e.generate(prompt, GREEDY)
        assert c.cached_tokens == 16
        assert c.token_ids == plain.generate(prompt, GREEDY).token_ids


def test_a_chat_turn_starts_where_the_last_one_ended(make_engine, plain):
    with make_engine() as e:
        convo = ids(37, 43)
        for turn in range(4):
            c = e.generate(convo, GREEDY)
            assert c.token_ids == plain.generate(convo, GREEDY).token_ids
            if turn:  # everything but the new message (and the reply's last token, never fed) is reused
                assert c.cached_tokens == len(convo) - 8 - 1, turn
            convo = convo + c.token_ids + ids(8, 44 + turn)


def test_eviction_under_pressure_keeps_outputs_identical(make_engine, plain):
    with make_engine() as probe:
        need = probe.budget.spec.bytes_for(120, probe.budget.block_size)
    with make_engine(cache_budget_bytes=need + need // 3) as e:
        prompts = [ids(100, 50 + i % 3) + ids(3, i) for i in range(9)]
        for p in prompts:
            assert e.generate(p, GREEDY).token_ids == plain.generate(p, GREEDY).token_ids
        assert e.stats()["prefix_evictions"] > 0
        assert e.budget.snapshot_bytes + e.budget.reserved_bytes <= e.budget.budget


def test_prefix_cache_off_has_no_stats_and_block_size_validated(model_dir, plain):
    assert "prefix_hits" not in plain.stats()
    with pytest.raises(ValueError, match="prefix_block_size"):
        Engine.from_dir(model_dir, prefix_block_size=0)
