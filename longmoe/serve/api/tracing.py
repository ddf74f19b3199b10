"""Optional OpenTelemetry traces: one trace per generation request, a ``longmoe.request`` span with
``queue``, ``prefill`` and ``decode`` children, built when the request finishes from the times the
API and the engine recorded (no span is open while it runs, so tracing adds nothing per token).

Off by default. ``longmoe serve --otlp-endpoint http://collector:4318/v1/traces`` exports them over
OTLP/HTTP in batches (needs the ``otel`` extra: ``pip install 'longmoe[otel]'``); ``Tracer`` also
takes any span exporter (the tests give an in-memory one). The span times are wall-clock, derived
from the monotonic marks at the end (``time.time_ns() - (now - mark)``).
"""

from __future__ import annotations

import time
from typing import Any

from longmoe.serve.request import Completion


class TracingUnavailable(RuntimeError):
    pass


class Tracer:
    """Builds and exports each finished request's spans through an OpenTelemetry span exporter."""

    def __init__(self, exporter: Any, service: str = "longmoe", batch: bool = True) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        except ImportError as e:  # pragma: no cover - depends on the extra being installed
            raise TracingUnavailable("tracing needs opentelemetry-sdk: pip install 'longmoe[otel]'") from e
        self.provider = TracerProvider(resource=Resource.create({"service.name": service}))
        proc = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(proc)
        self.tracer = self.provider.get_tracer("longmoe.serve")

    @classmethod
    def otlp(cls, endpoint: str, service: str = "longmoe") -> Tracer:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as e:
            raise TracingUnavailable(
                "--otlp-endpoint needs opentelemetry-exporter-otlp-proto-http: pip install 'longmoe[otel]'"
            ) from e
        return cls(OTLPSpanExporter(endpoint=endpoint), service)

    def record(
        self,
        request_id: str,
        route: str,
        start: float,
        admitted: float,
        first: float | None,
        end: float,
        c: Completion,
    ) -> None:
        """The spans of one finished request: monotonic times of the HTTP start, the engine's admission,
        the first token (None if none) and the end. ``queue`` covers reading and tokenizing too."""
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        now_m, now_ns = time.monotonic(), time.time_ns()

        def ns(t: float) -> int:
            return now_ns - int((now_m - t) * 1e9)

        admitted = min(max(admitted, start), end)
        first_t = max(first if first is not None else end, admitted)
        root = self.tracer.start_span("longmoe.request", start_time=ns(start))
        root.set_attributes(
            {
                "longmoe.request_id": request_id,
                "http.route": route,
                "gen_ai.usage.input_tokens": c.prompt_tokens,
                "gen_ai.usage.output_tokens": c.completion_tokens,
                "longmoe.cached_tokens": c.cached_tokens,
                "gen_ai.response.finish_reasons": (c.finish_reason,),
            }
        )
        if c.finish_reason == "error":
            root.set_status(Status(StatusCode.ERROR, c.error or "engine error"))
        ctx = set_span_in_context(root)
        for name, a, b in (
            ("queue", start, admitted),
            ("prefill", admitted, first_t),
            ("decode", first_t, end),
        ):
            span = self.tracer.start_span(name, context=ctx, start_time=ns(a))
            span.end(end_time=ns(max(a, b)))
        root.end(end_time=ns(end))

    def shutdown(self) -> None:
        self.provider.shutdown()
