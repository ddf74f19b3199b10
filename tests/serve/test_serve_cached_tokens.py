"""``usage.prompt_tokens_details.cached_tokens`` through the official ``openai`` client (completions and
chat, whole and streamed with ``include_usage``), the prefix-cache and session series of ``/metrics``
(present as zeros with the prefix cache off), and the page's "N cached (P%)" line from ``usage``."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess

import httpx
import openai
import pytest

from tests.helpers.prom import by_name, scrape
from tests.helpers.server import served, wait_idle

BS = 16  # prefix block size: the test prompts span several blocks
REUSE_KEYS = (
    "prefix_cache_hits_total",
    "prefix_cache_misses_total",
    "prefix_cache_tokens_reused_total",
    "prefix_cache_snapshot_bytes",
    "prefix_cache_snapshots",
    "prefix_cache_snapshots_stored_total",
    "prefix_cache_evictions_total",
    "session_turns_total",
    "session_tokens_reused_total",
    "session_evictions_total",
    "sessions_idle",
)


@pytest.fixture(scope="module")
def server(model_dir):
    with served(model_dir, prefill_chunk=BS, prefix_block_size=BS) as (engine, _, url):
        yield engine, url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[1] + "/v1", api_key="none", max_retries=0, timeout=60)


def long_prompt(topic: str) -> str:
    """A prompt of several prefix blocks, distinct per test so no test hits another's snapshots."""
    return f"{topic}: " + " ".join(f"step {i} of the {topic} plan" for i in range(12))


def metrics(url: str) -> dict[str, float]:
    """The series of ``/metrics`` labelled only by the model, by name without the ``longmoe_`` prefix."""
    return by_name(scrape(url))


def reused(engine) -> int:
    return wait_idle(engine)["prefix_tokens_reused"]


def test_second_completion_reports_the_reused_prefix(server, client):
    engine, _ = server
    prompt = long_prompt("garden")
    args = dict(model="tiny", prompt=prompt, max_tokens=4, temperature=0)
    before = reused(engine)
    first = client.completions.create(**args)
    mid = reused(engine)
    second = client.completions.create(**args)
    after = reused(engine)
    assert first.usage.prompt_tokens > 4 * BS
    assert first.usage.prompt_tokens_details.cached_tokens == 0 == mid - before
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= second.usage.prompt_tokens == first.usage.prompt_tokens
    assert cached == after - mid  # exactly what the engine reused
    assert second.choices[0].text == first.choices[0].text  # reuse never changes the output


def test_streamed_completion_reports_cached_in_the_usage_chunk(server, client):
    engine, _ = server
    args = dict(model="tiny", prompt=long_prompt("river"), max_tokens=4, temperature=0)
    whole = client.completions.create(**args)
    assert whole.usage.prompt_tokens_details.cached_tokens == 0
    mid = reused(engine)
    chunks = list(client.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and all(c.usage is None for c in chunks[:-1])  # OpenAI's shape
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert 0 < last.usage.prompt_tokens_details.cached_tokens == reused(engine) - mid
    plain = list(client.completions.create(**args, stream=True))
    assert all(c.usage is None for c in plain)  # no usage chunk unless asked for


def test_chat_completions_report_cached_tokens(server, client):
    engine, _ = server
    msgs = [{"role": "system", "content": long_prompt("harbour")}, {"role": "user", "content": "go on"}]
    args = dict(model="tiny", messages=msgs, max_tokens=4, temperature=0)
    first = client.chat.completions.create(**args)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    mid = reused(engine)
    second = client.chat.completions.create(**args)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached <= second.usage.prompt_tokens and cached == reused(engine) - mid
    mid = reused(engine)
    chunks = list(client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage.prompt_tokens == first.usage.prompt_tokens
    assert 0 < usage.prompt_tokens_details.cached_tokens == reused(engine) - mid


def test_metrics_count_hits_misses_and_reused_tokens(server, client):
    engine, url = server
    args = dict(model="tiny", prompt=long_prompt("lantern"), max_tokens=2, temperature=0)
    wait_idle(engine)
    m0 = metrics(url)
    assert set(REUSE_KEYS) <= set(m0)
    client.completions.create(**args)
    wait_idle(engine)
    m1 = metrics(url)
    assert m1["prefix_cache_misses_total"] == m0["prefix_cache_misses_total"] + 1
    assert m1["prefix_cache_hits_total"] == m0["prefix_cache_hits_total"]
    assert m1["prefix_cache_tokens_reused_total"] == m0["prefix_cache_tokens_reused_total"]
    assert m1["prefix_cache_snapshots_stored_total"] > m0["prefix_cache_snapshots_stored_total"]
    assert m1["prefix_cache_snapshot_bytes"] > 0 and m1["prefix_cache_snapshots"] > 0
    second = client.completions.create(**args)
    wait_idle(engine)
    m2 = metrics(url)
    assert m2["prefix_cache_hits_total"] == m1["prefix_cache_hits_total"] + 1
    assert m2["prefix_cache_misses_total"] == m1["prefix_cache_misses_total"]
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert m2["prefix_cache_tokens_reused_total"] == m1["prefix_cache_tokens_reused_total"] + cached > 0
    s = engine.stats()
    assert m2["prefix_cache_hits_total"] + m2["prefix_cache_misses_total"] == s["prefix_lookups"]
    assert m2["session_turns_total"] == s["session_turns"]  # the API runs no sessions: 0


def test_metrics_series_present_as_zeros_without_prefix_cache(model_dir):
    with served(model_dir, prefill_chunk=BS, prefix_cache=False) as (engine, _, url):
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        r = c.completions.create(model="tiny", prompt=long_prompt("quarry"), max_tokens=2)
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        wait_idle(engine)
        m = metrics(url)
    assert {k: m[k] for k in REUSE_KEYS} == dict.fromkeys(REUSE_KEYS, 0.0)


# --------------------------------------------------------------------- the web page's usage line
def page_function(page: str, name: str) -> str:
    """The source of a top-level ``function name(...) {...}`` of the page's script."""
    m = re.search(rf"^function {name}\(.*?^}}$", page, re.S | re.M)
    assert m is not None, f"{name} not in the page"
    return m.group(0)


def run_js(source: str, call: str) -> object:
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("no node to run the page's script")
    out = subprocess.run(
        [node, "-e", f"{source}\nconsole.log(JSON.stringify({call}));"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_page_asks_for_usage_and_shows_the_cached_share(server):
    _, url = server
    page = httpx.get(url + "/").text
    assert 'id="usage"' in page
    assert "stream_options: { include_usage: true }" in page  # the page's stream ends with usage
    assert "usageBox.textContent = usageText(chunk.usage)" in page
    fn = page_function(page, "usageText")
    assert "prompt_tokens_details" in fn
    cases = [
        {"prompt_tokens": 812, "prompt_tokens_details": {"cached_tokens": 768}},
        {"prompt_tokens": 5},
        {"prompt_tokens": 0, "prompt_tokens_details": {"cached_tokens": 0}},
        None,
    ]
    got = run_js(fn, f"{json.dumps(cases)}.map(usageText)")
    assert got == [
        "prompt 812 tokens, 768 cached (95%)",
        "prompt 5 tokens, 0 cached (0%)",
        "prompt 0 tokens, 0 cached (0%)",
        "",
    ]


def test_page_line_from_a_real_streamed_reply(server):
    """The body the page sends (streamed, ``include_usage``), twice: the line the page would show for
    the second reply names the cached tokens the server reported."""
    _, url = server
    msgs = [{"role": "user", "content": long_prompt("meadow")}]
    body = {"model": "tiny", "messages": msgs, "stream": True, "max_tokens": 3}
    body["stream_options"] = {"include_usage": True}
    for _ in range(2):
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            events = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ") and ln != "data: [DONE]"]
    usage = json.loads(events[-1])["usage"]
    n, cached = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached <= n
    page = httpx.get(url + "/").text
    line = run_js(page_function(page, "usageText"), f"usageText({json.dumps(usage)})")
    share = math.floor(100 * cached / n + 0.5)  # JavaScript's Math.round
    assert line == f"prompt {n} tokens, {cached} cached ({share}%)"
