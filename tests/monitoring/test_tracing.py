from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from monitoring.tracer_provider import create_tracer_provider
from monitoring.tracing import TracingSink, request_attributes
from tests.monitoring import synthetic as syn

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def sink(exporter: InMemorySpanExporter) -> TracingSink:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return TracingSink(provider)


def server_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]


def test_one_server_span_per_request_with_events_and_genai_attributes(
    sink: TracingSink, exporter: InMemorySpanExporter
) -> None:
    requests = syn.random_requests(3, seed=5, t0=time.time())
    for r in requests:
        sink.start_request(r.request_id, None, request_attributes(model=r.model, max_tokens=9))
    sink.record(finished=requests)
    spans = {s.attributes["fastllm.request_id"]: s for s in server_spans(exporter)}
    assert sorted(spans) == sorted(r.request_id for r in requests)
    for r in requests:
        span = spans[r.request_id]
        end_event = "CANCELLED" if r.finished_reason == "cancelled" else "FINISHED"
        assert [e.name for e in span.events] == ["QUEUED", "SCHEDULED", "FIRST_TOKEN", end_event]
        assert [e.timestamp for e in span.events] == [int(ts * 1e9) for _, ts in r.events]
        assert span.end_time == int(r.finished_ts * 1e9)  # type: ignore[operator]
        attrs = span.attributes
        assert attrs["gen_ai.operation.name"] == "text_completion"
        assert attrs["gen_ai.request.model"] == syn.MODEL
        assert attrs["gen_ai.usage.input_tokens"] == r.prompt_tokens
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == r.cached_tokens
        assert attrs["gen_ai.usage.output_tokens"] == r.completion_tokens
        assert attrs["gen_ai.request.max_tokens"] == r.max_tokens
        assert span.name == f"text_completion {syn.MODEL}"
    assert sink.num_open == 0
    assert any(r.cached_tokens for r in requests)  # the cache attribute was checked non-zero


def test_incoming_traceparent_becomes_the_parent(
    sink: TracingSink, exporter: InMemorySpanExporter
) -> None:
    r = syn.finished_request(0, t0=time.time(), prompt_tokens=4, completion_tokens=3)
    context = sink.start_request(r.request_id, TRACEPARENT, request_attributes(model=r.model))
    assert format(context.trace_id, "032x") == TRACE_ID
    sink.record(finished=[r])
    (span,) = server_spans(exporter)
    assert span.parent is not None and span.parent.is_remote
    assert format(span.parent.span_id, "016x") == PARENT_ID
    assert format(span.context.trace_id, "032x") == TRACE_ID


def test_step_spans_link_to_their_requests(
    sink: TracingSink, exporter: InMemorySpanExporter
) -> None:
    now = time.time()
    requests = [
        syn.finished_request(i, t0=now, prompt_tokens=5, completion_tokens=4) for i in range(3)
    ]
    contexts = {r.request_id: sink.start_request(r.request_id) for r in requests}
    sink.record(step=syn.step(1, ts=now + 0.1, request_ids=("req-0", "req-1")))
    sink.record(step=syn.step(2, ts=now + 0.2, request_ids=("req-2",)))
    sink.record(finished=requests)
    steps = [s for s in exporter.get_finished_spans() if s.name == "engine.step"]
    assert [s.attributes["fastllm.step.id"] for s in steps] == [1, 2]
    linked = [[link.context.span_id for link in s.links] for s in steps]
    assert linked == [
        [contexts["req-0"].span_id, contexts["req-1"].span_id],
        [contexts["req-2"].span_id],
    ]
    assert steps[0].start_time == int((now + 0.1 - 0.02) * 1e9)
    assert steps[0].end_time == int((now + 0.1) * 1e9)


def test_request_never_started_gets_a_span_on_the_spot(
    sink: TracingSink, exporter: InMemorySpanExporter
) -> None:
    bad = syn.rejected_request("bad-1", ts=time.time())
    bad.traceparent = TRACEPARENT
    sink.record(finished=[bad])
    (span,) = server_spans(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "validation"
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert [e.name for e in span.events] == ["QUEUED", "FINISHED"]


def test_open_spans_are_capped_and_expire(exporter: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = TracingSink(provider, max_open_spans=5, open_span_ttl_s=3600)
    for i in range(12):
        sink.start_request(f"lost-{i}")
    assert sink.num_open == 5 and sink.num_abandoned == 7
    abandoned = {s.attributes["fastllm.request_id"] for s in exporter.get_finished_spans()}
    assert abandoned == {f"lost-{i}" for i in range(7)}  # the oldest went first
    sink.open_span_ttl_s = -1.0  # everything is past its TTL, even a span opened just now
    sink.start_request("fresh")
    assert sink.num_open == 0 and sink.num_abandoned == 13


def test_head_sampling_ratio_zero_records_nothing(exporter: InMemorySpanExporter) -> None:
    provider = create_tracer_provider(sample_ratio=0.0, environ={})
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = TracingSink(provider)
    r = syn.finished_request(0, t0=time.time(), prompt_tokens=1, completion_tokens=2)
    sink.start_request(r.request_id)
    sink.record(finished=[r])
    assert exporter.get_finished_spans() == ()
    # a sampled parent still wins over the ratio (ParentBased)
    child = syn.finished_request(1, t0=time.time(), prompt_tokens=1, completion_tokens=2)
    sink.start_request(child.request_id, TRACEPARENT)
    sink.record(finished=[child])
    assert [s.attributes["fastllm.request_id"] for s in exporter.get_finished_spans()] == ["req-1"]
    assert provider.resource.attributes["service.name"] == "fastllm"


def test_spans_noted_by_the_server_open_at_their_admission_time_before_the_record(
    sink: TracingSink, exporter: InMemorySpanExporter
) -> None:
    """runtime.server.state.SpanStarts only notes a span (the request loop does no OTel work):
    the next record opens it with the noted parent and time, links steps to it, and ends it."""
    from runtime.server.state import SpanStarts

    starts = SpanStarts(sink.admitted)
    now = time.time()
    requests = [
        syn.finished_request(i, t0=now, prompt_tokens=5, completion_tokens=4) for i in range(2)
    ]
    for r in requests:
        starts(r.request_id, TRACEPARENT, request_attributes(model=r.model, max_tokens=9))
    assert sink.num_open == 0 and len(sink.admitted) == 2  # noted, nothing opened yet
    noted_ts = {rid: noted[2] for rid, noted in sink.admitted.items()}
    sink.record(step=syn.step(1, ts=now + 0.1, request_ids=("req-0", "req-1")))
    assert sink.num_open == 2 and not sink.admitted
    sink.record(finished=requests)
    spans = {s.attributes["fastllm.request_id"]: s for s in server_spans(exporter)}
    assert sorted(spans) == ["req-0", "req-1"] and sink.num_open == 0
    for span in spans.values():
        assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
        rid = span.attributes["fastllm.request_id"]
        assert span.start_time == int(noted_ts[rid] * 1e9)  # the noted time, not the record's
    (step,) = [s for s in exporter.get_finished_spans() if s.name == "engine.step"]
    assert sorted(link.context.span_id for link in step.links) == sorted(
        s.context.span_id for s in spans.values()
    )
