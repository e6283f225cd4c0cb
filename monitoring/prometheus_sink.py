"""PrometheusSink: maps the engine's stats dataclasses onto the contract metrics.

It only maps fields to set/inc/observe.

Nothing here is computed in the engine's hot loop: the engine hands over finished `StepStats` /
`RequestStats` / `VerificationResult` objects and this sink turns fields into samples.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from prometheus_client import Histogram

from monitoring.metric_names import ALLOCATOR_EVENTS, endpoint_of
from monitoring.metrics import FastllmMetrics
from runtime.engine.stats import (
    AllocatorStats,
    FailureReason,
    KVCacheStats,
    RequestStats,
    StepStats,
    VerificationResult,
)

# Failures that never entered the engine: their timestamps say nothing about serving latency.
REJECTED_REASONS = frozenset(
    {FailureReason.VALIDATION, FailureReason.OVERLOADED, FailureReason.UNAUTHORIZED}
)
DEFAULT_ANOMALY_THRESHOLD = 1e-3
_TIER_FIELDS = {"hit": "hits", "miss": "misses", "evict": "evictions", "release": "releases"}
assert set(_TIER_FIELDS) == set(ALLOCATOR_EVENTS)


class BusyWindow:
    """Engine busy fraction over the last `window_s` seconds, evaluated when asked (at scrape time),
    so an idle engine reads 0 even though it emits no steps. The default of
    `fastllm_device_busy_ratio` when nobody wires the engine's own tracker or NVML."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._steps: deque[tuple[float, float]] = deque()  # (step end ts, busy seconds)
        self._first_ts: float | None = None
        self._lock = threading.Lock()

    def add(self, step: StepStats) -> None:
        with self._lock:
            if self._first_ts is None:
                self._first_ts = step.started_ts or (step.ts - step.busy_seconds)
            self._steps.append((step.ts, step.busy_seconds))
            # prune here too: fraction() may never run (another busy source wins), and one entry per
            # step would otherwise grow without bound
            while self._steps and self._steps[0][0] < step.ts - self.window_s:
                self._steps.popleft()

    def fraction(self, now: float | None = None) -> float:
        now = time.time() if now is None else now
        with self._lock:
            while self._steps and self._steps[0][0] < now - self.window_s:
                self._steps.popleft()
            if self._first_ts is None:
                return 0.0
            busy = sum(b for _, b in self._steps)
            span = min(self.window_s, max(now - self._first_ts, 1e-9))
        return min(1.0, busy / span)


class PrometheusSink:
    """A `StatsSink` over `FastllmMetrics`. `models` are the served (model, version) pairs: their
    series are created at zero; other names (e.g. an unknown model in a rejected request) are
    reported as "unknown" so clients cannot grow label cardinality."""

    def __init__(
        self,
        metrics: FastllmMetrics,
        *,
        models: Sequence[tuple[str, str]] = (),
        device: str = "cpu",
        anomaly_threshold: float = DEFAULT_ANOMALY_THRESHOLD,
        utilization_window_s: float = 10.0,
    ) -> None:
        self.metrics = metrics
        self.device = device
        self.anomaly_threshold = anomaly_threshold
        self._known = {(m, v) for m, v in models}
        self._known_models = {m for m, _ in models}
        self._alloc_latest: dict[str, AllocatorStats] = {}
        self._alloc_counts: dict[tuple[str, str, str], int] = {}
        self._kv_latest: dict[tuple[str, str], dict[str, KVCacheStats]] = {}  # labels -> pools
        self._kv_counts: dict[tuple[str, str], int] = {}  # (pool, counter) -> last cumulative
        self._lock = threading.Lock()
        self._steals_seen = 0
        self._steals_source: Callable[[], int] | None = None
        self._allocator_source: Callable[[], AllocatorStats | None] | None = None
        self.busy = BusyWindow(utilization_window_s)
        for model, version in self._known:
            metrics.init_labels(model, version)
        metrics.init_allocator_labels()
        metrics.init_log_labels()
        self.set_utilization_source(lambda: None, device)
        self.set_busy_source(self.busy.fraction, device)

    # --- wiring hooks ---------------------------------------------------------------------------
    def _move_device(self, device: str) -> None:
        if device != self.device:
            self.metrics.device_utilization.remove(self.device)
            self.metrics.device_busy.remove(self.device)
            self.device = device

    def set_utilization_source(self, read: Callable[[], float | None], device: str) -> None:
        """Evaluate `fastllm_device_utilization_ratio{device}` at scrape time from `read` (the
        engine's `utilization()`: the batch controller's input). None (no step-time model yet,
        model not loaded) is exported as NaN: no comparison with it is true, so no alert fires
        on a value nobody measured."""
        self._move_device(device)

        def value() -> float:
            ratio = read()
            return math.nan if ratio is None else float(ratio)

        self.metrics.device_utilization.labels(device).set_function(value)

    def set_busy_source(self, read: Callable[[], float | None], device: str) -> None:
        """Evaluate `fastllm_device_busy_ratio{device}` from `read` (NVML on CUDA, the engine's
        busy fraction); when `read` has nothing, the busy fraction seen through StepStats."""
        self._move_device(device)

        def value() -> float:
            ratio = read()
            return self.busy.fraction() if ratio is None else float(ratio)

        self.metrics.device_busy.labels(device).set_function(value)

    def set_steals_source(self, read: Callable[[], int]) -> None:
        """Pull mode: `read()` returns the pool's cumulative steal count (PoolStats.num_steals);
        it is synced on every step (steals only happen while work is dispatched)."""
        self._steals_source = read

    def set_allocator_source(self, read: Callable[[], AllocatorStats | None]) -> None:
        """Read on each step whose StepStats has no allocator stats (engine.allocator_stats)."""
        self._allocator_source = read

    def sync_steals(self, cumulative: int) -> None:
        with self._lock:
            delta, self._steals_seen = cumulative - self._steals_seen, cumulative
        if delta > 0:
            self.metrics.scheduler_steals.inc(delta)

    def on_log_dropped(self, count: int = 1, reason: str = "queue_full") -> None:
        """The inference_log writer's on_drop hook."""
        self.metrics.inference_log_dropped.labels(reason).inc(count)

    def set_log_queue_source(self, read: Callable[[], int]) -> None:
        """`fastllm_inference_log_queue_rows` is `read()` at scrape time (the writer's queue)."""
        self.metrics.inference_log_queue_rows.set_function(lambda: float(read()))

    # --- StatsSink ------------------------------------------------------------------------------
    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        if step is not None:
            self._record_step(step)
        for request in finished:
            self._record_request(request)
        for result in verified:
            # its own tolerance when it carries one; NaN counts as an anomaly
            if result.is_anomaly(self.anomaly_threshold):
                labels = self._labels(result.model, result.version)
                self.metrics.operator_anomalies.labels(*labels, result.op).inc()

    def _labels(self, model: str, version: str) -> tuple[str, str]:
        if not self._known or (model, version) in self._known:
            return model, version
        return (model if model in self._known_models else "unknown"), "unknown"

    def _record_step(self, step: StepStats) -> None:
        m = self.metrics
        labels = self._labels(step.model, step.version)
        m.batch_size.labels(*labels).observe(step.num_seqs)
        m.batch_size_limit.labels(*labels).set(step.batch_size_limit)
        m.num_requests_running.labels(*labels).set(step.num_running)
        m.num_requests_waiting.labels(*labels).set(step.num_waiting)
        m.compile_fallbacks.labels(*labels).set(step.compile_fallbacks)
        self.busy.add(step)
        if self._steals_source is not None:
            self.sync_steals(self._steals_source())
        if step.kv is not None:
            self._record_kv(labels, step.kv)
        allocator = step.allocator
        if allocator is None and self._allocator_source is not None:
            allocator = self._allocator_source()
        if allocator is not None:
            self._record_allocator(allocator)

    def _record_allocator(self, stats: AllocatorStats) -> None:
        """Gauges sum the latest stats of every device; counters advance by the cumulative delta."""
        with self._lock:
            self._alloc_latest[stats.device] = stats
            for tier in stats.tiers:
                for event, field in _TIER_FIELDS.items():
                    key = (stats.device, tier.tier, event)
                    now = getattr(tier, field)
                    before = self._alloc_counts.get(key, 0)
                    delta = now - before if now >= before else now  # allocator was replaced
                    self._alloc_counts[key] = now
                    if delta:
                        self.metrics.allocator_events.labels(tier.tier, event).inc(delta)
            totals: dict[tuple[str, str], int] = {}
            for latest in self._alloc_latest.values():
                for tier in latest.tiers:
                    for state, value in (
                        ("in_use", tier.bytes_in_use),
                        ("cached", tier.bytes_cached),
                    ):
                        totals[(tier.tier, state)] = totals.get((tier.tier, state), 0) + value
            for (tier_name, state), value in totals.items():
                self.metrics.allocator_bytes.labels(tier_name, state).set(value)

    def _record_kv(self, labels: tuple[str, str], kv: KVCacheStats) -> None:
        """Gauges: the latest stats of every pool of (model, version) summed (replicas have a
        pool each). Counters advance by each pool's cumulative counts' delta."""
        m = self.metrics
        with self._lock:
            pools = self._kv_latest.setdefault(labels, {})
            pools[kv.pool_id] = kv
            total = KVCacheStats.total(list(pools.values()))
            deltas = []
            for name, now in (
                ("queries", kv.prefix_query_tokens),
                ("hits", kv.prefix_hit_tokens),
                ("preemptions", kv.num_preemptions),
            ):
                key = (kv.pool_id, name)
                before = self._kv_counts.get(key, 0)
                self._kv_counts[key] = now
                deltas.append(now - before if now >= before else now)  # the pool was replaced
        m.kv_cache_usage.labels(*labels).set(total.usage_ratio)
        for state, count in (
            ("used", total.num_used_pages),
            ("cached", total.num_cached_pages),
            ("free", total.num_free_pages),
        ):
            m.kv_cache_pages.labels(*labels, state).set(count)
        for counter, delta in zip(
            (m.prefix_cache_queries, m.prefix_cache_hits, m.num_preemptions), deltas, strict=True
        ):
            if delta:
                counter.labels(*labels).inc(delta)

    def _record_request(self, r: RequestStats) -> None:
        m = self.metrics
        labels = (*self._labels(r.model, r.version), endpoint_of(r.operation))
        m.prompt_tokens.labels(*labels).inc(r.prompt_tokens)
        m.generation_tokens.labels(*labels).inc(r.completion_tokens)
        if r.failure_reason is not None:
            m.request_failure.labels(*labels, r.failure_reason).inc()
        else:
            m.request_success.labels(*labels, r.finished_reason or "unknown").inc()
        if r.failure_reason in REJECTED_REASONS:
            return
        observations: tuple[tuple[float | None, Histogram], ...] = (
            (r.ttft_seconds, m.time_to_first_token),
            (r.tpot_seconds, m.time_per_output_token),
            (r.e2e_seconds, m.e2e_request_latency),
            (r.queue_seconds, m.request_queue),
        )
        for value, histogram in observations:
            if value is not None:
                histogram.labels(*labels).observe(max(0.0, value))
