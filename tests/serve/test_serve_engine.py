"""Engine: greedy == the model's full-forward argmax, chunked prefill exact at every chunk size,
batched == solo (no cross-talk), seeds reproduce, stops cut, budget waits/rejects, cancel frees."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch

from longmoe.serve.detok import CONTEXT_TOKENS, MAX_WINDOW
from longmoe.serve.engine import Engine, EngineConfig
from longmoe.serve.errors import EngineError
from longmoe.serve.sampling import SamplerState, SamplingError, SamplingParams, process_logits
from tests.helpers.models import MAX_CONTEXT, VOCAB, tiny_model

PROMPTS = ["import os", "class Foo(object):\n    def", "x = [1, 2, 3]\nfor", "def main(argv):\n    return"]
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(prefill_chunk=8)


def argmax_loop(model, ids: list[int], n: int) -> list[int]:
    """Reference: recompute the full forward over the whole sequence for every new token."""
    x = torch.tensor([ids])
    out = []
    with torch.no_grad():
        for _ in range(n):
            t = int(model(x).logits[0, -1].argmax())
            out.append(t)
            x = torch.cat([x, torch.tensor([[t]])], dim=1)
    return out


def test_greedy_equals_full_forward_argmax(engine):
    for p in PROMPTS[:3]:
        c = engine.generate(p, GREEDY)
        ids = engine.encode_prompt(p)
        assert c.token_ids == argmax_loop(engine.model, ids, GREEDY.max_tokens)
        assert c.finish_reason == "length"
        assert (c.prompt_tokens, c.completion_tokens) == (len(ids), GREEDY.max_tokens)
    assert len({tuple(engine.generate(p, GREEDY).token_ids) for p in PROMPTS}) == len(PROMPTS)


def test_chunked_prefill_sizes_identical(make_engine, engine):
    prompt = "def parse(text):\n    for line in text.splitlines():\n        yield line.strip()\n"
    ref = engine.generate(prompt, GREEDY).token_ids
    assert len(engine.encode_prompt(prompt)) > 16
    for cs in (1, 3, 16, 512):
        with make_engine(prefill_chunk=cs) as e:
            assert e.generate(prompt, GREEDY).token_ids == ref, f"prefill_chunk={cs}"


def test_batched_equals_solo_with_interleaved_prefill(engine):
    prompts = PROMPTS + ["a" * 50, "while True:\n    pass  # " + "x" * 30]
    params = [
        GREEDY if i % 2 == 0 else SamplingParams(max_tokens=8 + i, temperature=0.9, top_k=40, seed=i)
        for i in range(len(prompts))
    ]
    solo = [engine.generate(p, s).token_ids for p, s in zip(prompts, params, strict=True)]
    batched = engine.generate_batch(prompts, params)
    assert [c.token_ids for c in batched] == solo
    assert engine.stats()["steps"] > 0


def test_seed_reproduces_and_differs(make_engine):
    e = make_engine(tiny_model())  # the default EngineConfig, the model in memory
    s = lambda seed: SamplingParams(max_tokens=12, temperature=1.5, top_p=0.95, seed=seed, ignore_eos=True)
    a, b, c = (e.generate("hello", s(k)).token_ids for k in (7, 7, 8))
    assert a == b
    assert a != c


def test_stop_strings_cut_and_stream_concatenates(engine):
    full = engine.generate(PROMPTS[1], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    text = full.text
    printable = [i for i in range(2, len(text) - 1) if text[i].isprintable() and text[i] != "\ufffd"]
    assert printable, f"need a printable character in {text!r}"
    i = printable[len(printable) // 2]
    stop = text[i : i + 2] if text[i + 1] != "\ufffd" else text[i]
    p = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, stop=[stop])
    c = engine.generate(PROMPTS[1], p)
    assert c.finish_reason == "stop"
    assert c.text == text[: text.find(stop)]
    assert stop not in c.text
    assert "".join(engine.stream(PROMPTS[1], p)) == c.text


def test_stop_string_spanning_token_boundaries(engine):
    """A stop string made of the end of one token's text and the start of the next one's, among many
    long stop strings that never match: cut at the match, the stream concatenates to the result."""
    tok = engine.tokenizer
    full = engine.generate(PROMPTS[2], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    ids, text = full.token_ids, full.text
    ends = [len(tok.decode(ids[: j + 1], skip_special_tokens=True)) for j in range(len(ids))]
    spans = [
        (a, b)
        for a, b in zip(ends, ends[1:], strict=False)
        if 0 < a < b and "\ufffd" not in text[a - 1 : b] and text[a - 1 : b].isprintable()
    ]
    assert spans, f"need two adjacent printable tokens in {text!r}"
    a, b = spans[len(spans) // 2]
    stop = text[a - 1 : b]  # last character of one token + all of the next
    others = [f"never-{i}-" + "z" * 300 for i in range(15)]
    p = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=[*others, stop])
    c = engine.generate(PROMPTS[2], p)
    assert c.finish_reason == "stop" and c.text == text[: text.find(stop)]
    deltas = list(engine.stream(PROMPTS[2], p))
    assert "".join(deltas) == c.text


class CountingTokenizer:
    """The engine's tokenizer, recording how many ids each ``decode`` call gets."""

    def __init__(self, tok) -> None:
        self._tok, self.calls = tok, []

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def decode(self, ids, skip_special_tokens=False):
        self.calls.append(len(ids))
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)


def test_detokenising_work_per_token_does_not_grow(engine):
    """Deterministic, not timed: ids decoded per generated token stay bounded as the output grows
    (re-decoding the whole output would hand decode ~n ids at token n)."""
    ct = CountingTokenizer(engine.tokenizer)
    with Engine(engine.model, ct, EngineConfig(prefill_chunk=64)) as e:  # type: ignore[arg-type]
        per_token = []
        for n in (20, 300):
            ct.calls.clear()
            c = e.generate(PROMPTS[0], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
            assert c.completion_tokens == n
            assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert max(ct.calls) <= CONTEXT_TOKENS + MAX_WINDOW + 1
            per_token.append(sum(ct.calls) / n)
    assert per_token[1] <= 2 * per_token[0] + 1


def test_stop_token_ids_and_eos(engine):
    full = engine.generate(PROMPTS[0], GREEDY)
    t = full.token_ids[3]
    p = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, stop_token_ids=[t])
    c = engine.generate(PROMPTS[0], p)
    k = full.token_ids.index(t)
    assert c.finish_reason == "stop"
    assert c.token_ids == full.token_ids[: k + 1]  # the stop token is counted, not shown
    assert c.text == engine.tokenizer.decode(full.token_ids[:k], skip_special_tokens=True)


def test_logprobs(engine):
    p = SamplingParams(max_tokens=5, temperature=0.0, logprobs=True, top_logprobs=3)
    c = engine.generate(PROMPTS[2], p)
    ids = engine.encode_prompt(PROMPTS[2])
    with torch.no_grad():
        lp = torch.log_softmax(engine.model(torch.tensor([ids])).logits[0, -1].float(), -1)
    assert len(c.logprobs) == c.completion_tokens == len(c.top_logprobs)
    assert all(x <= 0 for x in c.logprobs)
    assert c.logprobs[0] == pytest.approx(float(lp.max()), abs=1e-4)
    assert c.top_logprobs[0][0][0] == c.token_ids[0]


def test_request_validation(engine):
    long_prompt = list(range(20, 20 + 50)) * (MAX_CONTEXT // 50 + 1)
    with pytest.raises(EngineError, match="prompt: has .* context window"):
        engine.generate(long_prompt, GREEDY)
    with pytest.raises(EngineError, match="max_tokens: .*context window"):
        engine.generate("hi", SamplingParams(max_tokens=MAX_CONTEXT))
    with pytest.raises(EngineError, match="prompt: is empty"):
        engine.generate([], GREEDY)
    with pytest.raises(EngineError, match=r"prompt: token ids must be in \[0, 512\)"):
        engine.generate([1, 99999], GREEDY)
    for kw, field in [
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"stop": [""]}, "stop"),
        ({"max_tokens": "3"}, "max_tokens"),
        ({"frequency_penalty": 3.0}, "frequency_penalty"),
    ]:
        with pytest.raises(SamplingError, match=f"^{field}:"):
            SamplingParams(**kw)
    with pytest.raises(ValueError, match="prefill_chunk"):
        EngineConfig(prefill_chunk=0)
    with pytest.raises(ValueError, match="max_context"):
        EngineConfig(max_context=1)


def test_max_context_defaults_to_the_window_and_can_be_raised(make_engine):
    ids = [5 + i % (VOCAB - 10) for i in range(MAX_CONTEXT)]  # as long as the window: no room left
    with make_engine() as e:
        assert e.max_context == MAX_CONTEXT
        with pytest.raises(EngineError, match="^prompt:.*context window"):
            e.generate(ids, GREEDY)
    with make_engine(max_context=2 * MAX_CONTEXT) as e:
        c = e.generate(ids, GREEDY)
        assert c.prompt_tokens == MAX_CONTEXT and len(c.token_ids) == GREEDY.max_tokens
        assert c.token_ids == argmax_loop(e.model, ids, GREEDY.max_tokens)


def test_cache_budget_rejects_and_waits(make_engine):
    probe = make_engine()
    spec = probe.spec
    probe.close()
    one = spec.bytes_for(64)  # room for one request of <= 64 tokens at a time
    with make_engine(cache_budget_bytes=one + spec.fixed // 2) as e:
        with pytest.raises(EngineError, match="max_tokens: request needs .* cache budget"):
            e.generate("hi", SamplingParams(max_tokens=200))
        p = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
        solo = [e.generate(q, p).token_ids for q in PROMPTS[:3]]
        handles = [e.submit(q, p) for q in PROMPTS[:3]]
        time.sleep(0.05)
        assert e.stats()["running"] <= 1  # the others wait for the budget
        assert [h.result().token_ids for h in handles] == solo
        assert e.budget.reserved_bytes == 0


def test_cancel_frees_cache(engine):
    h = engine.submit(PROMPTS[0], SamplingParams(max_tokens=500, temperature=0.0, ignore_eos=True))
    for n, _ev in enumerate(h.events()):
        if n == 3:
            break
    assert engine.stats()["cache_bytes_in_use"] > 0
    h.cancel()
    assert h.result().finish_reason == "cancelled"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (engine.stats()["running"] or engine.stats()["cache_bytes_in_use"]):
        time.sleep(0.01)
    s = engine.stats()
    assert (s["running"], s["cache_bytes_in_use"], s["cache_bytes_reserved"]) == (0, 0, 0)


def test_from_run_dir_picks_newest_complete_checkpoint(model_dir, tmp_path):
    from longmoe.checkpoint import save_checkpoint
    from tests.helpers.models import tiny_model

    run = tmp_path / "run"
    tok = model_dir / "tokenizer.json"
    save_checkpoint(run, 1, tiny_model(seed=0), tok, {"step": 1})
    newest = tiny_model(seed=1)
    save_checkpoint(run, 2, newest, tok, {"step": 2})
    with Engine.from_dir(run) as e:
        assert torch.equal(e.model.embed.weight, newest.embed.weight)


def test_from_run_dir_and_missing(model_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(model_dir, run / "final")
    with Engine.from_dir(run) as e:
        assert e.max_context == MAX_CONTEXT
        assert e.tokenizer.vocab_size == VOCAB
    with pytest.raises(FileNotFoundError, match="neither a model directory"):
        Engine.from_dir(tmp_path)
    with pytest.raises(TypeError, match="unknown options"):
        Engine.from_dir(model_dir, chunk=3)


def test_sampling_filters():
    logits = torch.tensor([3.0, 1.0, 0.5, -1.0, 2.0])
    st = lambda **kw: SamplerState(SamplingParams(**kw), [], 5, "cpu")
    assert torch.isfinite(process_logits(logits, st(top_k=2))).sum() == 2
    x = process_logits(logits, st(top_p=0.01))
    assert torch.isfinite(x).tolist() == [True, False, False, False, False]  # nucleus keeps >= 1 token
    s = SamplerState(SamplingParams(temperature=0.0, repetition_penalty=2.0), [0], 5, "cpu")
    assert process_logits(logits, s).tolist()[0] == 1.5  # positive logit of a seen token halved
    s = st(temperature=0.0, frequency_penalty=1.0)
    s.observe(0)
    s.observe(0)
    assert process_logits(logits, s).tolist()[0] == 1.0


def test_a_consumer_that_raises_loses_only_its_own_request(make_engine):
    """A library caller's sink that raises mid-stream finishes that request with an error; the other
    requests in the same batch run to the end unchanged."""
    from longmoe.serve.sampling import SamplingParams
    from tests.helpers.models import tiny_model

    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    events = []

    def bad_sink(ev):
        events.append(ev)
        if len(events) == 2:
            raise RuntimeError("consumer went away")

    with make_engine(tiny_model()) as e:
        ref = e.generate([5, 6, 7, 8], params).token_ids
        e.submit([9, 10, 11], params, sink=bad_sink)
        good = e.submit([5, 6, 7, 8], params)
        assert [t for ev in good.events() for t in ev.token_ids] == ref
    assert len(events) == 3 and events[-1].done is not None and events[-1].done.finish_reason == "error"


def test_a_waiting_caller_runs_the_steps_in_its_own_thread(make_engine, monkeypatch):
    """Queue handles are driven by the caller waiting on them (the thread that built the model keeps
    one OpenMP pool): no engine thread starts, and every step runs in the caller's thread."""
    with make_engine(prefill_chunk=8) as e:
        seen = []
        step = e.step
        monkeypatch.setattr(e, "step", lambda: (seen.append(threading.get_ident()), step())[1])
        outs = e.generate_batch(PROMPTS[:2], GREEDY)
        assert [len(o.token_ids) for o in outs] == [10, 10]
        assert e._thread is None and seen and set(seen) == {threading.get_ident()}


def test_sink_requests_run_on_the_engine_thread_beside_waiting_callers(make_engine):
    """A sink's events flow with nobody waiting (the API server's case): the engine thread starts and
    runs them; a queue handle submitted meanwhile waits for that thread instead of pumping, with the
    same greedy tokens as alone."""
    with make_engine(prefill_chunk=8) as e:
        want = e.generate(PROMPTS[0], GREEDY).token_ids
        got = []
        done = threading.Event()

        def sink(ev):
            got.extend(ev.token_ids)
            if ev.done is not None:
                done.set()

        e.submit(PROMPTS[0], GREEDY, sink=sink)
        assert e._thread is not None and e._thread.is_alive()
        assert e.generate(PROMPTS[0], GREEDY).token_ids == want
        assert done.wait(60) and got == want


def test_a_stream_stopped_early_frees_its_row_without_an_engine_thread(make_engine):
    with make_engine(prefill_chunk=8) as e:
        it = e.stream(PROMPTS[0], SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
        next(it)
        it.close()  # cancels; the cancelling caller runs the step that drops the row
        assert e._thread is None
        assert e.stats()["running"] == 0 and e.cache_bytes_in_use == 0


def test_run_forever_runs_every_step_on_its_thread_until_stopped(make_engine, monkeypatch):
    """``run_forever`` (``longmoe serve``'s main thread) runs sink and queue requests alike on the thread
    that called it, refuses a second runner, and returns on ``stop()``."""
    with make_engine(prefill_chunk=8) as e:
        want = e.generate(PROMPTS[0], GREEDY).token_ids
        seen = []
        step = e.step
        monkeypatch.setattr(e, "step", lambda: (seen.append(threading.get_ident()), step())[1])
        runner = threading.Thread(target=e.run_forever)
        runner.start()
        while e._thread is not runner:
            time.sleep(0.01)
        with pytest.raises(RuntimeError, match="already run"):
            e.run_forever()
        done, got = threading.Event(), []
        e.submit(PROMPTS[0], GREEDY, sink=lambda ev: (got.extend(ev.token_ids), ev.done and done.set()))
        assert e.generate(PROMPTS[0], GREEDY).token_ids == want
        assert done.wait(60) and got == want
        e.stop()
        runner.join(30)
        assert not runner.is_alive() and e._thread is None
        assert set(seen) == {runner.ident}
