"""OpenTelemetry traces: `TracingSink` (the provider factory is in monitoring.tracer_provider).

One SERVER span per request (parent = the incoming W3C `traceparent`), carrying QUEUED / SCHEDULED /
FIRST_TOKEN / FINISHED (or CANCELLED) events at the engine's own timestamps and the GenAI semantic
convention attributes; one INTERNAL span per engine step, linked to the request spans it served.
Everything hangs off the provider passed in (never the global one), so tests use their own.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from runtime.engine.stats import (
    FinishReason,
    RequestEvent,
    RequestStats,
    StepStats,
    VerificationResult,
)

_PROPAGATOR = TraceContextTextMapPropagator()

_END_EVENT = {True: RequestEvent.CANCELLED, False: RequestEvent.FINISHED}


def request_attributes(
    *, model: str, operation: str = "text_completion", max_tokens: int | None = None
) -> dict[str, AttributeValue]:
    """The GenAI attributes known at admission (what the server passes to `start_request`)."""
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": model,
    }
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    return attributes


def _ns(ts: float) -> int:
    return int(ts * 1e9)


@dataclass
class _OpenSpan:
    span: trace.Span
    opened_at: float  # time.monotonic(), for the TTL


class TracingSink:
    """A `StatsSink` that turns request lives and engine steps into spans.

    Spans of admitted requests stay open until their `RequestStats` arrive; at most `max_open_spans`
    are kept and none longer than `open_span_ttl_s` (the oldest are ended, marked abandoned), so a
    request that never finishes cannot leak memory.

    The server opens a request's span either with `start_request` or, off its request loop, by
    noting it in `admitted` (request id -> traceparent, attributes, admission time; one dict
    store, runtime.server.state.SpanStarts): `record` opens the noted spans first, at their
    admission time, so a step's links and a request's end always find them."""

    def __init__(
        self,
        provider: trace.TracerProvider,
        *,
        max_open_spans: int = 10_000,
        open_span_ttl_s: float = 3600.0,
        step_spans: bool = True,
    ) -> None:
        self._tracer = provider.get_tracer("fastllm.monitoring")
        self.max_open_spans = max_open_spans
        self.open_span_ttl_s = open_span_ttl_s
        self.step_spans = step_spans
        self._open: OrderedDict[str, _OpenSpan] = OrderedDict()
        self._lock = threading.Lock()
        self.num_abandoned = 0
        # spans noted by the server, to open (see the class doc); drained under `_lock`
        self.admitted: dict[str, tuple[str | None, Mapping[str, AttributeValue], float]] = {}

    @property
    def num_open(self) -> int:
        return len(self._open)

    def start_request(
        self,
        request_id: str,
        traceparent: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        *,
        start_ts: float | None = None,
    ) -> trace.SpanContext:
        """Open the request's SERVER span when the server admits it; returns its span context."""
        attributes = dict(attributes or {})
        span = self._start_span(request_id, traceparent, attributes, start_ts)
        with self._lock:
            stale = self._keep_locked(request_id, span)
        for old in stale:
            self._abandon(old)
        return span.get_span_context()

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        if self.admitted:
            self._open_admitted()
        if step is not None and self.step_spans:
            self._record_step(step)
        for request in finished:
            self._finish(request)

    def close(self) -> None:
        """End every open span (server shutdown)."""
        self._open_admitted()
        with self._lock:
            spans = [entry.span for entry in self._open.values()]
            self._open.clear()
        for span in spans:
            self._abandon(span)

    # --- internals ------------------------------------------------------------------------------
    def _open_admitted(self) -> None:
        """Open the spans the server noted, oldest first. Under the lock: another engine's
        recorder thread linking a step to one of them waits until it is open."""
        stale: list[trace.Span] = []
        with self._lock:
            noted = []
            while self.admitted:  # the server adds more meanwhile: popitem is atomic
                try:
                    noted.append(self.admitted.popitem())
                except KeyError:
                    break
            noted.sort(key=lambda item: item[1][2])
            for request_id, (traceparent, attributes, start_ts) in noted:
                span = self._start_span(request_id, traceparent, dict(attributes), start_ts)
                stale.extend(self._keep_locked(request_id, span))
        for old in stale:
            self._abandon(old)

    def _keep_locked(self, request_id: str, span: trace.Span) -> list[trace.Span]:
        """Keep `span` open for `request_id`; the spans it displaces or that expired."""
        previous = self._open.pop(request_id, None)
        self._open[request_id] = _OpenSpan(span, time.monotonic())
        expired = self._expire_locked()
        return ([previous.span] if previous else []) + expired

    def _start_span(
        self,
        request_id: str,
        traceparent: str | None,
        attributes: MutableMapping[str, AttributeValue],
        start_ts: float | None,
    ) -> trace.Span:
        # An explicit empty Context: the parent is the caller's header, not the current span.
        carrier = {"traceparent": traceparent} if traceparent else {}
        parent = _PROPAGATOR.extract(carrier, context=Context())
        attributes["fastllm.request_id"] = request_id
        operation = attributes.get("gen_ai.operation.name", "request")
        name = f"{operation} {attributes.get('gen_ai.request.model', '')}"
        return self._tracer.start_span(
            name.strip(),
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=None if start_ts is None else _ns(start_ts),
        )

    def _record_step(self, step: StepStats) -> None:
        with self._lock:
            links = [
                Link(self._open[rid].span.get_span_context())
                for rid in step.request_ids
                if rid in self._open
            ]
        started = step.started_ts or (step.ts - step.busy_seconds)
        span = self._tracer.start_span(
            "engine.step",
            context=Context(),
            kind=SpanKind.INTERNAL,
            links=links,
            start_time=_ns(started),
            attributes={
                "fastllm.step.id": step.step_id,
                "fastllm.step.num_seqs": step.num_seqs,
                "fastllm.step.num_prefill_tokens": step.num_prefill_tokens,
                "fastllm.step.num_decode_tokens": step.num_decode_tokens,
                "fastllm.step.busy_seconds": step.busy_seconds,
                "fastllm.step.batch_size_limit": step.batch_size_limit,
                "gen_ai.request.model": step.model,
            },
        )
        span.end(end_time=_ns(step.ts))

    def _finish(self, r: RequestStats) -> None:
        with self._lock:
            entry = self._open.pop(r.request_id, None)
        if entry is not None:
            span = entry.span
        else:  # never admitted (e.g. failed validation): create and end it on the spot
            attrs = request_attributes(
                model=r.model, operation=r.operation, max_tokens=r.max_tokens
            )
            span = self._start_span(r.request_id, r.traceparent, attrs, r.queued_ts or None)
        for event, ts in _events(r):
            span.add_event(event.value, timestamp=_ns(ts))
        span.set_attributes(
            {
                "gen_ai.operation.name": r.operation,
                "gen_ai.request.model": r.model,
                "gen_ai.request.max_tokens": r.max_tokens,
                "gen_ai.usage.input_tokens": r.prompt_tokens,
                "gen_ai.usage.output_tokens": r.completion_tokens,
                # OTel GenAI: input tokens served from a cache (included in input_tokens)
                "gen_ai.usage.cache_read.input_tokens": r.cached_tokens,
                "fastllm.model_version": r.version,
                "fastllm.batch_size": r.batch_size,
                "fastllm.constraint": r.constraint,  # structured output: none, json, tools, ...
            }
        )
        if r.constraint != "none":
            span.set_attribute("fastllm.grammar_incomplete", r.grammar_incomplete)
        if r.spec_draft_tokens:  # speculative decoding drafted for it
            span.set_attribute("fastllm.spec.draft_tokens", r.spec_draft_tokens)
            span.set_attribute("fastllm.spec.accepted_tokens", r.spec_accepted_tokens)
        if r.finished_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", (r.finished_reason,))
        if r.failure_reason is not None:
            span.set_attribute("error.type", r.failure_reason)
            span.set_status(Status(StatusCode.ERROR, r.failure_reason))
        span.end(end_time=_ns(r.finished_ts) if r.finished_ts is not None else None)

    def _expire_locked(self) -> list[trace.Span]:
        expired: list[trace.Span] = []
        deadline = time.monotonic() - self.open_span_ttl_s
        while self._open:
            oldest = next(iter(self._open.values()))
            if len(self._open) <= self.max_open_spans and oldest.opened_at >= deadline:
                break
            expired.append(self._open.popitem(last=False)[1].span)
        return expired

    def _abandon(self, span: trace.Span) -> None:
        self.num_abandoned += 1
        span.set_attribute("fastllm.abandoned", True)
        span.set_status(Status(StatusCode.ERROR, "request never reported as finished"))
        span.end()


def _events(r: RequestStats) -> list[tuple[RequestEvent, float]]:
    """The engine's event log, or (when it kept none) the events implied by the timestamps."""
    if r.events:
        return sorted(r.events, key=lambda event: event[1])
    derived: list[tuple[RequestEvent, float | None]] = [
        (RequestEvent.QUEUED, r.queued_ts or None),
        (RequestEvent.SCHEDULED, r.scheduled_ts),
        (RequestEvent.FIRST_TOKEN, r.first_token_ts),
        (
            RequestEvent.CANCELLED
            if r.finished_reason == FinishReason.CANCELLED
            else RequestEvent.FINISHED,
            r.finished_ts,
        ),
    ]
    return [(event, ts) for event, ts in derived if ts is not None]
