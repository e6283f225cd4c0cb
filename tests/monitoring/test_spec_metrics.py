"""Speculative-decoding telemetry: the step's draft counts and each request's acceptance as
Prometheus series (read back with prometheus_client's own parser) and span attributes."""

from __future__ import annotations

import time
from dataclasses import replace

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from monitoring.spec_metrics import SpecDecodeMetrics, SpecDecodeSink
from monitoring.tracer_provider import create_tracer_provider
from monitoring.tracing import TracingSink
from tests.monitoring import synthetic as syn


def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, s.labels.get("le", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("method") == "ngram"
    }


def test_draft_counts_and_acceptance_become_series() -> None:
    registry = CollectorRegistry()
    sink = SpecDecodeSink(SpecDecodeMetrics.create(registry), [(syn.MODEL, syn.VERSION)], "ngram")
    before = samples(registry)
    assert before[("fastllm_spec_decode_num_draft_tokens_total", "")] == 0
    step = replace(
        syn.step(0, ts=time.time()),
        num_draft_tokens=12,
        num_accepted_tokens=9,
        num_emitted_tokens=12,
        spec_method="ngram",
    )
    base = syn.finished_request(0, t0=time.time(), prompt_tokens=4, completion_tokens=3)
    drafted = replace(base, spec_draft_tokens=10, spec_accepted_tokens=7)
    sink.record(step=step, finished=[drafted, base])  # base drafted nothing: not observed
    sink.record(step=syn.step(1, ts=time.time()))  # a step without drafts adds nothing
    after = samples(registry)
    assert after[("fastllm_spec_decode_num_draft_tokens_total", "")] == 12
    assert after[("fastllm_spec_decode_num_accepted_tokens_total", "")] == 9
    assert after[("fastllm_spec_decode_num_emitted_tokens_total", "")] == 12
    assert after[("fastllm_spec_decode_acceptance_ratio_count", "")] == 1
    assert after[("fastllm_spec_decode_acceptance_ratio_sum", "")] == 0.7
    assert after[("fastllm_spec_decode_acceptance_ratio_bucket", "0.6")] == 0
    assert after[("fastllm_spec_decode_acceptance_ratio_bucket", "0.7")] == 1


def test_the_span_carries_the_request_acceptance() -> None:
    exporter = InMemorySpanExporter()
    provider = create_tracer_provider(service_name="t", sample_ratio=1.0)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = TracingSink(provider)
    base = syn.finished_request(0, t0=time.time(), prompt_tokens=4, completion_tokens=3)
    tracing.record(finished=[replace(base, spec_draft_tokens=8, spec_accepted_tokens=5)])
    tracing.record(finished=[replace(base, request_id="plain")])
    tracing.close()
    spans = {
        s.attributes.get("fastllm.request_id", s.name): s for s in exporter.get_finished_spans()
    }
    attrs = [dict(s.attributes or {}) for s in spans.values()]
    drafted = [a for a in attrs if "fastllm.spec.draft_tokens" in a]
    assert len(drafted) == 1 and len(attrs) == 2
    assert drafted[0]["fastllm.spec.draft_tokens"] == 8
    assert drafted[0]["fastllm.spec.accepted_tokens"] == 5
