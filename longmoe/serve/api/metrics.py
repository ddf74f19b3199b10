"""``GET /metrics``: Prometheus text of the HTTP counters and the engine's stats (behind the API key
when one is set, unless ``ServerConfig.metrics_public``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from longmoe.serve.api.middleware import HTTPMetrics
from longmoe.serve.api.security import check_key
from longmoe.serve.api.state import server_state
from longmoe.serve.engine import Engine
from longmoe.serve.request import FINISH_REASONS

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


def render(metrics: HTTPMetrics, engine: Engine) -> str:
    s = engine.stats()
    lines = [
        "# HELP longmoe_http_requests_total HTTP requests by route and status code.",
        "# TYPE longmoe_http_requests_total counter",
    ]
    with metrics.lock:
        for (route, status), n in sorted(metrics.requests.items()):
            lines.append(f'longmoe_http_requests_total{{route="{route}",status="{status}"}} {n}')
    for name, kind, help_, key in _SERIES:
        n = f"longmoe_{name}"
        lines += [f"# HELP {n} {help_}", f"# TYPE {n} {kind}", f"{n} {s[key]}"]
    lines.append("# TYPE longmoe_finished_requests_total counter")
    for reason in FINISH_REASONS:
        lines.append(f'longmoe_finished_requests_total{{reason="{reason}"}} {s[f"finished_{reason}"]}')
    return "\n".join(lines) + "\n"


async def prometheus(request: Request) -> Response:
    st = server_state(request)
    if not st.config.metrics_public:
        check_key(request, st.config.api_key)
    return PlainTextResponse(render(st.metrics, st.engine), media_type="text/plain; version=0.0.4")
