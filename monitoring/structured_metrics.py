"""Structured-output metrics: a sink of its own next to the Prometheus sink (it reads the grammar
fields of `RequestStats`; runtime.engine.constraints fills them), on the same registry.

    fastllm_constrained_requests_total{kind}   requests with a constraint (json, regex, choice,
                                               grammar, tools), however they ended
    fastllm_grammar_compile_seconds            compiles a request waited for (cache misses)
    fastllm_grammar_cache_hits_total / _misses_total
    fastllm_grammar_cache_events_total{event}  hit, miss, evict (entries pushed out of the byte
                                               bound), timeout (compiles killed over their time or
                                               memory budget)
    fastllm_grammar_incomplete_total           outputs that ended (stop string, max_tokens) before
                                               their grammar was complete: they may not parse
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram

from runtime.engine.stats import RequestStats, StepStats, VerificationResult

__all__ = ["CONSTRAINT_KINDS", "STRUCTURED_METRIC_NAMES", "StructuredOutputSink"]

CONSTRAINT_KINDS: tuple[str, ...] = ("json", "regex", "choice", "grammar", "tools")
STRUCTURED_METRIC_NAMES: tuple[str, ...] = (
    "fastllm_constrained_requests_total",
    "fastllm_grammar_compile_seconds",
    "fastllm_grammar_cache_hits_total",
    "fastllm_grammar_cache_misses_total",
    "fastllm_grammar_incomplete_total",
    "fastllm_grammar_cache_events_total",
)
CACHE_EVENTS: tuple[str, ...] = ("hit", "miss", "evict", "timeout")
# compiles take ~1 ms (a choice) to seconds (a large schema on a large vocabulary)
COMPILE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_MV = ("model", "version")


@dataclass
class StructuredMetrics:
    constrained_requests: Counter
    compile_seconds: Histogram
    cache_hits: Counter
    cache_misses: Counter
    incomplete: Counter
    cache_events: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> StructuredMetrics:
        r = registry
        return cls(
            constrained_requests=Counter(
                "fastllm_constrained_requests_total",
                "Requests whose output was constrained (structured output), by kind.",
                [*_MV, "kind"],
                registry=r,
            ),
            compile_seconds=Histogram(
                "fastllm_grammar_compile_seconds",
                "Grammar compiles a request waited for (compiled-grammar cache misses).",
                _MV,
                buckets=COMPILE_BUCKETS_S,
                registry=r,
            ),
            cache_hits=Counter(
                "fastllm_grammar_cache_hits_total",
                "Constrained requests whose compiled grammar was cached.",
                _MV,
                registry=r,
            ),
            cache_misses=Counter(
                "fastllm_grammar_cache_misses_total",
                "Constrained requests whose grammar had to be compiled.",
                _MV,
                registry=r,
            ),
            incomplete=Counter(
                "fastllm_grammar_incomplete_total",
                "Constrained outputs that ended (max_tokens, a stop string) before their grammar "
                "was complete.",
                _MV,
                registry=r,
            ),
            cache_events=Counter(
                "fastllm_grammar_cache_events_total",
                "Compiled-grammar cache events: hit, miss, evict, timeout (a compile killed over "
                "its time or memory budget).",
                [*_MV, "event"],
                registry=r,
            ),
        )

    def init_labels(self, model: str, version: str) -> None:
        for metric in (self.compile_seconds, self.cache_hits, self.cache_misses, self.incomplete):
            metric.labels(model, version)
        for kind in CONSTRAINT_KINDS:
            self.constrained_requests.labels(model, version, kind)
        for event in CACHE_EVENTS:
            self.cache_events.labels(model, version, event)


class StructuredOutputSink:
    """A StatsSink: maps the grammar fields of finished requests to the metrics above."""

    def __init__(self, metrics: StructuredMetrics, models: Sequence[tuple[str, str]] = ()) -> None:
        self.metrics = metrics
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
            if r.constraint == "none":
                continue
            labels = (r.model, r.version)
            m.constrained_requests.labels(*labels, r.constraint).inc()
            if r.grammar_cache_hit is True:
                m.cache_hits.labels(*labels).inc()
                m.cache_events.labels(*labels, "hit").inc()
            elif r.grammar_cache_hit is False:
                m.cache_misses.labels(*labels).inc()
                m.cache_events.labels(*labels, "miss").inc()
            if r.grammar_cache_evictions:
                m.cache_events.labels(*labels, "evict").inc(r.grammar_cache_evictions)
            if r.grammar_compile_timeout:
                m.cache_events.labels(*labels, "timeout").inc()
            if r.grammar_compile_seconds is not None:
                m.compile_seconds.labels(*labels).observe(r.grammar_compile_seconds)
            if r.grammar_incomplete:
                m.incomplete.labels(*labels).inc()
