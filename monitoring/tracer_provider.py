"""The OpenTelemetry tracer provider `TracingSink` (monitoring.tracing) records on: service name,
head sampling, and an OTLP/HTTP exporter when the standard environment asks for one."""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

_OTLP_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def create_tracer_provider(
    *,
    service_name: str = "fastllm",
    sample_ratio: float = 1.0,
    environ: Mapping[str, str] = os.environ,
) -> TracerProvider:
    """Provider with `service.name` and head sampling ParentBased(TraceIdRatioBased(ratio)).
    An OTLP/HTTP exporter is attached only when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set; the
    exporter itself reads the other standard OTEL_EXPORTER_OTLP_* variables (headers, timeout).
    """
    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
    )
    if any(environ.get(name) for name in _OTLP_ENDPOINT_VARS):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
