"""Structured-output telemetry: the grammar fields of RequestStats as Prometheus series (read
back with prometheus_client's own parser) and as span attributes."""

from __future__ import annotations

import time
from dataclasses import replace

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring.structured_metrics import StructuredMetrics, StructuredOutputSink
from monitoring.tracer_provider import create_tracer_provider
from monitoring.tracing import TracingSink
from tests.monitoring import synthetic as syn


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (
            s.name,
            tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model", "version"))),
        ): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_grammar_fields_become_series() -> None:
    registry = CollectorRegistry()
    sink = StructuredOutputSink(StructuredMetrics.create(registry), [(syn.MODEL, syn.VERSION)])
    base = syn.finished_request(0, t0=time.time(), prompt_tokens=4, completion_tokens=3)
    before = samples(registry)
    assert before[("fastllm_constrained_requests_total", (("kind", "tools"),))] == 0
    sink.record(
        finished=[
            replace(base, constraint="json", grammar_cache_hit=False, grammar_compile_seconds=0.02),
            replace(base, constraint="json", grammar_cache_hit=True, grammar_incomplete=True),
            replace(base, constraint="tools", grammar_cache_hit=True),
            base,  # unconstrained: counted nowhere here
        ]
    )
    after = samples(registry)
    assert after[("fastllm_constrained_requests_total", (("kind", "json"),))] == 2
    assert after[("fastllm_constrained_requests_total", (("kind", "tools"),))] == 1
    assert after[("fastllm_grammar_cache_hits_total", ())] == 2
    assert after[("fastllm_grammar_cache_misses_total", ())] == 1
    assert after[("fastllm_grammar_incomplete_total", ())] == 1
    assert after[("fastllm_grammar_compile_seconds_count", ())] == 1
    assert after[("fastllm_grammar_compile_seconds_sum", ())] == 0.02


def test_the_span_carries_the_constraint_kind() -> None:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider(service_name="t", sample_ratio=1.0)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = TracingSink(provider)
    base = syn.finished_request(0, t0=time.time(), prompt_tokens=4, completion_tokens=3)
    tracing.record(
        finished=[
            replace(base, request_id="a", constraint="regex", grammar_incomplete=True),
            replace(base, request_id="b"),
        ]
    )
    spans = {
        s.attributes["fastllm.request_id"]: s.attributes for s in exporter.get_finished_spans()
    }
    assert spans["a"]["fastllm.constraint"] == "regex" and spans["a"]["fastllm.grammar_incomplete"]
    assert spans["b"]["fastllm.constraint"] == "none"
    assert "fastllm.grammar_incomplete" not in spans["b"]
    tracing.close()
    provider.shutdown()
