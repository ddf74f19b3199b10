"""The scheduler without a model: admission against the budget, FIFO order, cancellation, the step
plan, batch membership and sessions' kept rows. Caches are stand-ins (the scheduler never looks inside)
and the runner's ``StepOutput`` is written by hand: a step is ``schedule`` -> (runner) -> ``update``."""

from __future__ import annotations

import pytest

from longmoe.serve.budget import CacheBudget, CacheSpec
from longmoe.serve.errors import EngineError
from longmoe.serve.request import Event, Request
from longmoe.serve.sampling import SamplingParams, TokenChoice
from longmoe.serve.scheduler import Scheduler
from longmoe.serve.session import Session
from longmoe.serve.step import RowOutput, StepOutput, StepPlan

BLOCK = 16
SPEC = CacheSpec(fixed=1000, per_token=10)


class FakeCache:
    """What the scheduler and ``Sessions`` touch of a cache: its length and its bytes."""

    def __init__(self, n: int = 0) -> None:
        self.seq_lens = [n]

    def nbytes(self) -> int:
        return SPEC.bytes_for(max(1, self.seq_lens[0]), BLOCK)


def scheduler(requests_fit: int = 4, extra_bytes: int = 0, **kw) -> Scheduler:
    """A scheduler whose budget holds ``requests_fit`` requests of 64 tokens (prompt + max_tokens)."""
    budget = CacheBudget(SPEC, requests_fit * SPEC.bytes_for(64, BLOCK) + extra_bytes, BLOCK)
    opts = {"max_batch": 8, "max_waiting": 16, "prefill_chunk": 64, "max_context": 4096} | kw
    return Scheduler(budget, FakeCache, **opts)


EVENTS: dict[int, list[Event]] = {}  # request id -> what its sink received


def request(n_prompt: int = 32, max_tokens: int = 32, session: Session | None = None) -> Request:
    rid = len(EVENTS)
    EVENTS[rid] = []
    params = SamplingParams(max_tokens=max_tokens)
    return Request(rid, list(range(1, n_prompt + 1)), params, EVENTS[rid].append, session=session)


def prefill_output(plan: StepPlan) -> StepOutput:
    """What the runner returns for ``plan``'s prefill chunk: completed prompts get token 7 and join."""
    out = StepOutput()
    for r in plan.prefill:
        out.fed[r.id] = plan.chunk
        if r.n_fed + plan.chunk == len(r.prompt_ids):
            out.first[r.id] = RowOutput([TokenChoice(7)])
            out.joined.append(r.id)
    return out


def run_prefill(s: Scheduler) -> list[Request]:
    """Plan steps and feed their chunks until every admitted prompt is complete; returns the joined."""
    done = []
    while (plan := s.schedule()).prefill:
        out = prefill_output(plan)
        done += [r for r in plan.prefill if r.id in out.joined]
        s.update(plan, out)
    return done


def decode(s: Scheduler, finish: dict[int, str] | None = None, rows: dict | None = None) -> StepPlan:
    """One decode step: every running row gets token 7; ``finish``: the runner's finishes by id,
    ``rows``: the rows it handed back."""
    plan = s.schedule()
    out = StepOutput(rows=rows or {})
    for r in plan.decode:
        out.decoded[r.id] = RowOutput([TokenChoice(7)], (finish or {}).get(r.id))
    s.update(plan, out)
    return plan


def test_admission_reserves_whole_life_and_keeps_arrival_order():
    small_bytes = SPEC.bytes_for(4, BLOCK)
    s = scheduler(requests_fit=2, extra_bytes=small_bytes)  # two requests, and room for a small one
    a, b, c, small = request(), request(), request(), request(n_prompt=2, max_tokens=2)
    for r in (a, b, c, small):
        s.add(r)
    s.intake()
    s.schedule()
    assert s.prefilling == [a, b]  # c does not fit; small would, but may not overtake c
    assert list(s.waiting) == [c, small]
    assert s.budget.reserved == {a.id: SPEC.bytes_for(64, BLOCK), b.id: SPEC.bytes_for(64, BLOCK)}
    s.finish(a, "stop")  # its reservation is released: c, then small, fit
    s.prefilling.remove(a)
    s.schedule()
    assert s.prefilling == [b, c, small] and not s.waiting


def test_max_batch_caps_admission():
    s = scheduler(requests_fit=8, max_batch=2)
    rs = [request() for _ in range(3)]
    for r in rs:
        s.add(r)
    s.intake()
    s.schedule()
    assert s.n_running == 2 and list(s.waiting) == rs[2:]


def test_queue_full_and_closed_are_refused():
    s = scheduler(max_waiting=2)
    s.add(request())
    s.add(request())
    with pytest.raises(EngineError, match="queue: is full") as e:
        s.add(request())
    assert e.value.status == 503
    s.close()
    assert not s.wait_for_work()
    with pytest.raises(RuntimeError, match="closed"):
        s.add(request())


def test_plan_shares_one_chunk_between_the_oldest_prefilling_requests():
    s = scheduler(requests_fit=4, prefill_chunk=64)
    long, short = request(n_prompt=100, max_tokens=8), request(n_prompt=40, max_tokens=8)
    s.add(long)
    s.add(short)
    s.intake()
    plan = s.schedule()
    assert plan.decode == [] and plan.prefill == [long, short]
    assert plan.chunk == 32  # min(shortest remaining prompt 40, 64 // 2 rows)
    assert all(r.cache is not None for r in plan.prefill)  # each has its own fresh cache


def test_prefilled_requests_join_the_batch_and_decode_next_step():
    s = scheduler()
    rs = [request(n_prompt=20), request(n_prompt=50)]
    for r in rs:
        s.add(r)
    s.intake()
    assert run_prefill(s) == rs
    assert s.running == rs
    assert all(r.cache is None for r in rs)  # their rows now live in the runner's batch
    assert s.schedule().decode == rs


def test_cancel_frees_waiting_prefilling_and_running_requests():
    s = scheduler(requests_fit=2)
    running, prefilling, waiting = request(n_prompt=8), request(n_prompt=40), request()
    s.add(running)
    s.intake()
    run_prefill(s)
    s.add(prefilling)
    s.add(waiting)
    s.intake()
    s.schedule()
    assert s.running == [running] and s.prefilling == [prefilling] and list(s.waiting) == [waiting]
    for r in (running, prefilling, waiting):
        s.cancel(r)
    plan = s.schedule()
    assert plan.leaving == {running.id: False} and plan.decode == []  # leaves first, nothing handed back
    s.update(plan, StepOutput())
    assert not s.has_work() and s.budget.reserved == {}
    for r in (running, prefilling, waiting):
        assert EVENTS[r.id][-1].done.finish_reason == "cancelled"
    assert s.finished["cancelled"] == 3


def test_finished_rows_leave_the_batch_in_order():
    s = scheduler()
    rs = [request(n_prompt=8) for _ in range(3)]
    for r in rs:
        s.add(r)
    s.intake()
    run_prefill(s)
    decode(s, finish={rs[1].id: "length"})  # the runner finished it: its row left in that step
    assert s.running == [rs[0], rs[2]] and not s.leaving
    assert EVENTS[rs[1].id][-1].done.finish_reason == "length"


def test_rows_finished_by_the_output_side_leave_at_the_next_step():
    s = scheduler()
    rs = [request(n_prompt=8), request(n_prompt=8)]
    for r in rs:
        s.add(r)
    s.intake()
    run_prefill(s)
    s.finish(rs[0], "stop")  # (as update does when the output processor finds one)
    s.leaving[rs[0].id] = rs[0].keeps_row
    plan = decode(s)
    assert plan.leaving == {rs[0].id: False} and plan.decode == [rs[1]]
    assert s.running == [rs[1]]


def test_session_keeps_its_row_and_the_next_turn_reuses_it():
    s = scheduler()
    sess = Session()
    first = request(n_prompt=24, session=sess)
    s.add(first)
    assert sess.active
    s.intake()
    run_prefill(s)
    # the runner finishes it at its second token and hands back its row (prompt + first token)
    decode(s, finish={first.id: "stop_token"}, rows={first.id: FakeCache(25)})
    assert sess.tokens == first.prompt_ids + first.out and not sess.active
    assert s.sessions.idle == {sess.id: sess} and sess.cached == 25
    assert s.budget.reserved == {sess.key: SPEC.bytes_for(25, BLOCK)}  # the row, not the old max_tokens
    second = request(n_prompt=len(sess.tokens) + 5, session=sess)
    s.add(second)
    s.intake()
    plan = s.schedule()
    assert second.reused == second.n_fed == 25  # the kept row: only the new tokens are prefilled
    assert plan.chunk == len(second.prompt_ids) - 25
    assert sess.key not in s.budget.reserved and second.id in s.budget.reserved


def test_cancelled_session_turn_drops_the_row():
    s = scheduler()
    sess = Session()
    r = request(session=sess)
    s.add(r)
    s.intake()
    run_prefill(s)
    s.cancel(r)
    plan = s.schedule()
    assert plan.leaving == {r.id: False}  # a cancelled turn leaves the context unchanged, keeps no row
    s.update(plan, StepOutput())
    assert not s.sessions.idle and sess.tokens == [] and not sess.active
