"""``GET /metrics``: the server's Prometheus series through ``prometheus-client`` (behind the API key
when one is set, unless ``ServerConfig.metrics_public``), every one labelled ``model_name``.

Two kinds of series. Per-request histograms (time to first token, time per output token, end-to-end
latency, queue time, prompt and generated tokens), observed by ``ServeMetrics.observe`` on the engine
thread when an API request finishes (serve/api/generation.py). Everything else (HTTP responses,
errors, the engine's counters and gauges) is read at scrape time by ``_Snapshot``, a custom collector
over ``engine.stats()`` and ``HTTPMetrics``, so the names stay those of the hand-written exposition
this replaced (``longmoe_requests_total``, ...) and no counter grows the extra ``<name>_created``
series ``prometheus_client.Counter`` would add; the histograms' ``_created`` samples are dropped too
(``_NoCreated``), so every name scraped is one docs/deploy.md lists. The prefix-cache and session
series are always present (zeros when the engine runs without a prefix cache), so dashboards and
alerts never see a series vanish.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from longmoe.serve.api.middleware import HTTPMetrics
from longmoe.serve.api.security import check_key
from longmoe.serve.api.state import server_state
from longmoe.serve.engine import Engine
from longmoe.serve.request import FINISH_REASONS, Completion

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ERROR_CODES = ("engine_error", "server_shutting_down")  # always exported (0 until seen)
LABEL = "model_name"

# Buckets: latencies span a 10 ms cached prefill to minutes of long-context prefill on a CPU.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640, 1280)
TOKEN_BUCKETS = tuple(float(2**i) for i in range(0, 21))  # 1 .. 1M tokens

_SERIES = [  # (name, kind, help, engine.stats() key)
    ("requests_total", "counter", "requests submitted to the engine", "requests"),
    ("prompt_tokens_total", "counter", "prompt tokens submitted", "prompt_tokens"),
    ("generated_tokens_total", "counter", "tokens generated", "generated_tokens"),
    ("tokens_per_second", "gauge", "generated tokens/s over the last 10 s", "tokens_per_second"),
    ("queue_depth", "gauge", "requests waiting for admission", "waiting"),
    ("running_requests", "gauge", "requests prefilling or decoding", "running"),
    ("cache_bytes_in_use", "gauge", "live KDA state + MLA latent bytes", "cache_bytes_in_use"),
    ("cache_bytes_reserved", "gauge", "bytes reserved by admitted requests", "cache_bytes_reserved"),
    ("cache_budget_bytes", "gauge", "cache budget", "cache_budget_bytes"),
]

_REUSE_SERIES = [  # (name, kind, help, engine.stats() key): 0 when the engine lacks the key
    ("prefix_cache_hits_total", "counter", "prefills that restored a prefix snapshot", "prefix_hits"),
    ("prefix_cache_misses_total", "counter", "prefix lookups that found no snapshot", "prefix_misses"),
    ("prefix_cache_tokens_reused_total", "counter", "prompt tokens from snapshots", "prefix_tokens_reused"),
    ("prefix_cache_snapshot_bytes", "gauge", "bytes held by prefix snapshots", "prefix_snapshot_bytes"),
    ("prefix_cache_snapshots", "gauge", "prefix snapshots held", "prefix_snapshots"),
    ("prefix_cache_snapshots_stored_total", "counter", "prefix snapshots taken", "prefix_snapshots_stored"),
    ("prefix_cache_evictions_total", "counter", "prefix snapshots evicted", "prefix_evictions"),
    ("session_turns_total", "counter", "requests that continued a session", "session_turns"),
    ("session_tokens_reused_total", "counter", "prompt tokens from kept rows", "session_tokens_reused"),
    ("session_evictions_total", "counter", "idle sessions' kept rows evicted", "session_evictions"),
    ("sessions_idle", "gauge", "idle sessions holding a kept row", "sessions_idle"),
]


def reuse_stats(s: dict) -> dict[str, float]:
    """The prefix-cache and session counters of ``engine.stats()`` (misses = lookups - hits), 0 for
    any the engine does not report."""
    out = {key: s.get(key, 0) for *_, key in _REUSE_SERIES}
    out["prefix_misses"] = s.get("prefix_lookups", 0) - s.get("prefix_hits", 0)
    return out


def _family(kind: str, name: str, help_: str, labels: list[str]) -> Metric:
    """A counter family keeps ``name`` whole (``..._total``): ``CounterMetricFamily`` strips the suffix
    for the family and writes it back on each sample."""
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    return cls(name, help_, labels=labels)


class _Snapshot(Collector):
    """The series read at scrape time: HTTP responses and errors (``HTTPMetrics``), the engine's
    counters and gauges (``engine.stats()``)."""

    def __init__(self, engine: Engine, http: HTTPMetrics, model: str) -> None:
        self.engine, self.http, self.model = engine, http, model

    def collect(self) -> Iterator[Metric]:
        s, m = self.engine.stats(), self.model
        with self.http.lock:
            responses = sorted(self.http.requests.items())
            errors = dict(self.http.errors)
        f = CounterMetricFamily(
            "longmoe_http_requests_total",
            "HTTP requests by route and status code.",
            labels=[LABEL, "route", "status"],
        )
        for (route, status), n in responses:
            f.add_metric([m, route, str(status)], n)
        yield f
        f = CounterMetricFamily(
            "longmoe_request_errors_total",
            "admitted requests that failed, by error type.",
            labels=[LABEL, "type"],
        )
        for code in sorted({*ERROR_CODES, *errors}):
            f.add_metric([m, code], errors.get(code, 0))
        yield f
        reuse = reuse_stats(s)
        for series, values in ((_SERIES, s), (_REUSE_SERIES, reuse)):
            for name, kind, help_, key in series:
                f = _family(kind, f"longmoe_{name}", help_, [LABEL])
                f.add_metric([m], values[key])
                yield f
        f = CounterMetricFamily(
            "longmoe_finished_requests_total",
            "requests finished, by finish reason.",
            labels=[LABEL, "reason"],
        )
        for reason in FINISH_REASONS:
            f.add_metric([m, reason], s[f"finished_{reason}"])
        yield f


class _NoCreated(Collector):
    """A collector's families without their ``_created`` samples (a histogram's start time, which
    would be one more series per name and label set, read by nothing here)."""

    def __init__(self, inner: Collector) -> None:
        self.inner = inner

    def collect(self) -> Iterator[Metric]:
        for fam in self.inner.collect():
            fam.samples = [x for x in fam.samples if not x.name.endswith("_created")]
            yield fam


class ServeMetrics:
    """The app's registry (one per app, so many apps in one process never collide) and its histograms."""

    def __init__(self, engine: Engine, http: HTTPMetrics, model: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model = model
        reg = CollectorRegistry(auto_describe=True)  # the histograms' own, read through _NoCreated

        def hist(name: str, help_: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_, [LABEL], buckets=buckets, registry=reg).labels(model)

        self.ttft = hist(
            "longmoe_time_to_first_token_seconds", "HTTP request start to first token.", TTFT_BUCKETS
        )
        self.tpot = hist(
            "longmoe_time_per_output_token_seconds",
            "a request's mean time per output token after the first (decode time / (tokens - 1)).",
            TPOT_BUCKETS,
        )
        self.e2e = hist(
            "longmoe_e2e_request_latency_seconds", "HTTP request start to last token.", E2E_BUCKETS
        )
        self.queue = hist(
            "longmoe_request_queue_time_seconds", "engine submission to admission.", E2E_BUCKETS
        )
        self.prompt = hist("longmoe_request_prompt_tokens", "prompt tokens per request.", TOKEN_BUCKETS)
        self.generated = hist(
            "longmoe_request_generation_tokens", "generated tokens per request.", TOKEN_BUCKETS
        )
        self.registry.register(_Snapshot(engine, http, model))
        self.registry.register(_NoCreated(reg))

    def observe(self, start: float, first: float | None, end: float, c: Completion) -> None:
        """One finished request (monotonic seconds: HTTP start, first token or None, last event)."""
        self.e2e.observe(end - start)
        self.queue.observe(c.queue_s)
        self.prompt.observe(c.prompt_tokens)
        self.generated.observe(c.completion_tokens)
        if first is not None and c.completion_tokens >= 1:
            self.ttft.observe(first - start)
            if c.completion_tokens >= 2:
                self.tpot.observe((end - first) / (c.completion_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def prometheus(request: Request) -> Response:
    st = server_state(request)
    if not st.config.metrics_public:
        check_key(request, st.config.api_key)
    return Response(st.prometheus.render(), media_type=CONTENT_TYPE)
