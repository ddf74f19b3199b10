"""``GET /metrics``: Prometheus text of the HTTP counters and the engine's stats (behind the API key
when one is set, unless ``ServerConfig.metrics_public``).

The prefix-cache and session series are always present (zeros when the engine runs without a prefix
cache, whose stats then lack those keys), so dashboards and alerts never see a series vanish."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from longmoe.serve.api.middleware import HTTPMetrics
from longmoe.serve.api.security import check_key
from longmoe.serve.api.state import server_state
from longmoe.serve.engine import Engine
from longmoe.serve.request import FINISH_REASONS

ERROR_CODES = ("engine_error", "server_shutting_down")  # always exported (0 until one happens)

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


def render(metrics: HTTPMetrics, engine: Engine) -> str:
    s = engine.stats()
    lines = [
        "# HELP longmoe_http_requests_total HTTP requests by route and status code.",
        "# TYPE longmoe_http_requests_total counter",
    ]
    with metrics.lock:
        for (route, status), n in sorted(metrics.requests.items()):
            lines.append(f'longmoe_http_requests_total{{route="{route}",status="{status}"}} {n}')
        errors = dict(metrics.errors)
    lines += [
        "# HELP longmoe_request_errors_total admitted requests that failed, by error type.",
        "# TYPE longmoe_request_errors_total counter",
    ]
    for code in sorted({*ERROR_CODES, *errors}):
        lines.append(f'longmoe_request_errors_total{{type="{code}"}} {errors.get(code, 0)}')
    for name, kind, help_, key in _SERIES:
        n = f"longmoe_{name}"
        lines += [f"# HELP {n} {help_}", f"# TYPE {n} {kind}", f"{n} {s[key]}"]
    reuse = reuse_stats(s)
    for name, kind, help_, key in _REUSE_SERIES:
        n = f"longmoe_{name}"
        lines += [f"# HELP {n} {help_}", f"# TYPE {n} {kind}", f"{n} {reuse[key]}"]
    lines.append("# TYPE longmoe_finished_requests_total counter")
    for reason in FINISH_REASONS:
        lines.append(f'longmoe_finished_requests_total{{reason="{reason}"}} {s[f"finished_{reason}"]}')
    return "\n".join(lines) + "\n"


async def prometheus(request: Request) -> Response:
    st = server_state(request)
    if not st.config.metrics_public:
        check_key(request, st.config.api_key)
    return PlainTextResponse(render(st.metrics, st.engine), media_type="text/plain; version=0.0.4")
