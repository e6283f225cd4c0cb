"""Metrics per request priority (issue 38, `scheduling_policy=priority`): a sink of its own next to
the Prometheus sink, on the same registry, reading `RequestStats.priority`.

    fastllm_priority_requests_total{priority}                 requests that entered the engine
    fastllm_priority_request_queue_seconds{priority}          admission to first schedule
    fastllm_priority_time_to_first_token_seconds{priority}    admission to first token

`priority` is the request's priority clamped to [-10, 10] (a client picks any integer: the label
set stays bounded); under the default fcfs policy every request reads priority 0 unless it sent
one, so the series show what a priority policy would order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from runtime.engine.stats import FailureReason, RequestStats, StepStats, VerificationResult

__all__ = ["PRIORITY_METRIC_NAMES", "PriorityMetrics", "PrioritySink", "priority_label"]

PRIORITY_METRIC_NAMES: tuple[str, ...] = (
    "fastllm_priority_requests_total",
    "fastllm_priority_request_queue_seconds",
    "fastllm_priority_time_to_first_token_seconds",
)
PRIORITY_BOUND = 10
_MVP = ("model", "version", "priority")
# refused before the engine: no queue, no first token
_REFUSED = frozenset(
    (FailureReason.VALIDATION, FailureReason.OVERLOADED, FailureReason.UNAUTHORIZED)
)


def priority_label(priority: int) -> str:
    return str(max(-PRIORITY_BOUND, min(PRIORITY_BOUND, priority)))


@dataclass
class PriorityMetrics:
    requests: Counter
    queue_seconds: Histogram
    ttft_seconds: Histogram

    @classmethod
    def create(
        cls, registry: CollectorRegistry, latency_buckets_s: Sequence[float]
    ) -> PriorityMetrics:
        buckets = tuple(sorted(latency_buckets_s))
        return cls(
            requests=Counter(
                "fastllm_priority_requests_total",
                "Requests that entered the engine, by priority (clamped to [-10, 10]).",
                _MVP,
                registry=registry,
            ),
            queue_seconds=Histogram(
                "fastllm_priority_request_queue_seconds",
                "Time from admission to the first schedule, by priority.",
                _MVP,
                buckets=buckets,
                registry=registry,
            ),
            ttft_seconds=Histogram(
                "fastllm_priority_time_to_first_token_seconds",
                "Time from admission to the first generated token, by priority.",
                _MVP,
                buckets=buckets,
                registry=registry,
            ),
        )

    def init_labels(self, model: str, version: str) -> None:
        for metric in (self.requests, self.queue_seconds, self.ttft_seconds):
            metric.labels(model, version, "0")


class PrioritySink:
    """A StatsSink: each finished request that entered the engine, under its priority."""

    def __init__(self, metrics: PriorityMetrics, models: Sequence[tuple[str, str]] = ()) -> None:
        self.metrics = metrics
        self.models = {(m, v) for m, v in models}
        for model, version in models:
            metrics.init_labels(model, version)

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        m = self.metrics
        for r in finished:
            if r.failure_reason in _REFUSED:
                continue  # never queued
            if self.models and (r.model, r.version) not in self.models:
                continue  # a name a client made up: the label sets stay bounded
            labels = (r.model, r.version, priority_label(r.priority))
            m.requests.labels(*labels).inc()
            if r.queue_seconds is not None:
                m.queue_seconds.labels(*labels).observe(max(0.0, r.queue_seconds))
            if r.ttft_seconds is not None:
                m.ttft_seconds.labels(*labels).observe(max(0.0, r.ttft_seconds))
