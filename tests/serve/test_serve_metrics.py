"""``/metrics`` through ``prometheus-client``: the histograms (TTFT, time per output token, end-to-end
latency, queue time, prompt and generated tokens) count each finished request with its own numbers;
every series carries the ``model_name`` label; the names of the hand-written exposition are kept and
no ``_created`` series appears; the exposition parses as Prometheus text."""

from __future__ import annotations

import json

import httpx
import pytest

from longmoe.serve.api.metrics import _REUSE_SERIES, _SERIES
from tests.helpers.prom import by_name, samples, scrape, value
from tests.helpers.server import served, wait_idle

HISTOGRAMS = (
    "longmoe_time_to_first_token_seconds",
    "longmoe_time_per_output_token_seconds",
    "longmoe_e2e_request_latency_seconds",
    "longmoe_request_queue_time_seconds",
    "longmoe_request_prompt_tokens",
    "longmoe_request_generation_tokens",
)


@pytest.fixture(scope="module")
def server(model_dir):
    with served(model_dir, prefill_chunk=16) as (engine, _, url):
        yield engine, url


def _counts(url: str) -> dict[str, float]:
    m = scrape(url)
    out = {}
    for h in HISTOGRAMS:
        out[h + "_count"] = value(m, h + "_count", model_name="tiny")
        out[h + "_sum"] = value(m, h + "_sum", model_name="tiny")
    return out


def test_histograms_count_each_request_with_its_own_numbers(server):
    engine, url = server
    before = _counts(url)
    body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 6, "ignore_eos": True, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
    chat = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = None
    with httpx.stream("POST", url + "/v1/chat/completions", json=chat, timeout=60) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    wait_idle(engine)
    after = _counts(url)
    d = {k: after[k] - before[k] for k in after}
    for h in HISTOGRAMS:
        assert d[h + "_count"] == 2, h
    assert d["longmoe_request_prompt_tokens_sum"] == r["usage"]["prompt_tokens"] + usage["prompt_tokens"]
    assert d["longmoe_request_generation_tokens_sum"] == 6 + 5
    # latencies are positive, TTFT below end-to-end, per-token time below end-to-end
    assert 0 < d["longmoe_time_to_first_token_seconds_sum"] <= d["longmoe_e2e_request_latency_seconds_sum"]
    assert 0 < d["longmoe_time_per_output_token_seconds_sum"] < d["longmoe_e2e_request_latency_seconds_sum"]
    assert d["longmoe_request_queue_time_seconds_sum"] >= 0


def test_buckets_are_cumulative_and_end_at_the_count(server):
    _, url = server
    httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 2}, timeout=60)
    m = scrape(url)
    for h in HISTOGRAMS:
        buckets = sorted(
            ((float(dict(ls)["le"]), v) for (n, ls), v in m.items() if n == h + "_bucket"), key=lambda x: x[0]
        )
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), h
        assert buckets[-1][0] == float("inf") and buckets[-1][1] == value(m, h + "_count"), h


def test_every_series_is_labelled_by_model_and_none_is_created(server):
    _, url = server
    r = httpx.get(url + "/metrics")
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = samples(r.text)
    assert m, "no samples"
    assert all(dict(ls).get("model_name") == "tiny" for (_, ls) in m), "a series without model_name"
    assert not [n for (n, _) in m if n.endswith("_created")]


def test_the_hand_written_names_are_kept(server):
    _, url = server
    m = scrape(url)
    plain = by_name(m)
    for name, *_ in (*_SERIES, *_REUSE_SERIES):
        assert name in plain, name
    for reason in ("stop", "length", "cancelled", "error"):
        assert value(m, "longmoe_finished_requests_total", reason=reason) >= 0
    for code in ("engine_error", "server_shutting_down"):
        assert value(m, "longmoe_request_errors_total", type=code) >= 0
    assert value(m, "longmoe_http_requests_total", route="/metrics", status="200") >= 1


def test_apps_in_one_process_keep_their_own_series(model_dir, server):
    """Two apps (two registries) never share or clash: the second starts from zero."""
    with served(model_dir) as (_, _, url2):
        m = scrape(url2)
        assert value(m, "longmoe_e2e_request_latency_seconds_count") == 0
    assert value(scrape(server[1]), "longmoe_e2e_request_latency_seconds_count") > 0
