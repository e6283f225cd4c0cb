"""The metric contract (DESIGN.md, "Metric names"): every name, type and label set in one place.

Dashboards and alert rules depend on these names, so they are spelled out literally here. All
metrics live on a registry the caller owns (one per app instance; never the process-global one). The
memory gauges `fastllm_memory_usage{type}` / `fastllm_memory_total{type}` are produced at scrape
time by `monitoring.samplers.MemoryCollector`, registered on the same registry. The names every
scrape shows and the label values pre-initialised are in monitoring.metric_names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from monitoring.metric_names import (
    ALLOCATOR_EVENTS,
    ALLOCATOR_STATES,
    ALLOCATOR_TIERS,
    ENDPOINTS,
    FAILURE_REASONS,
    FINISHED_REASONS,
    KV_PAGE_STATES,
    LOG_DROP_REASONS,
    VERIFIED_OPS,
)

DEFAULT_BATCH_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)

_MV = ("model", "version")
_MVE = ("model", "version", "endpoint")  # the request metrics


@dataclass
class FastllmMetrics:
    """The contract's metric objects on one registry (memory gauges excepted, see module doc)."""

    registry: CollectorRegistry
    device_utilization: Gauge
    device_busy: Gauge
    batch_size: Histogram
    batch_size_limit: Gauge
    num_requests_running: Gauge
    num_requests_waiting: Gauge
    time_to_first_token: Histogram
    time_per_output_token: Histogram
    e2e_request_latency: Histogram
    request_queue: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    request_success: Counter
    request_failure: Counter
    allocator_bytes: Gauge
    allocator_events: Counter
    operator_anomalies: Counter
    scheduler_steals: Counter
    inference_log_dropped: Counter
    inference_log_queue_rows: Gauge
    kv_cache_usage: Gauge
    kv_cache_pages: Gauge
    prefix_cache_queries: Counter
    prefix_cache_hits: Counter
    num_preemptions: Counter
    build_info: Gauge
    compile_fallbacks: Gauge

    @classmethod
    def create(
        cls,
        registry: CollectorRegistry,
        *,
        latency_buckets_s: Sequence[float],
        batch_buckets: Sequence[float] = DEFAULT_BATCH_BUCKETS,
    ) -> FastllmMetrics:
        r = registry
        lat = tuple(sorted(latency_buckets_s))
        return cls(
            registry=r,
            device_utilization=Gauge(
                "fastllm_device_utilization_ratio",
                "Share of the device's saturation throughput the engine delivers (0-1): busy "
                "fraction x throughput at the current batch / at saturation. The batch "
                "controller's input. NaN until the engine has a step-time model.",
                ["device"],
                registry=r,
            ),
            device_busy=Gauge(
                "fastllm_device_busy_ratio",
                "Duty cycle (0-1): NVML utilization.gpu on CUDA, the engine's busy fraction "
                "otherwise. A cross-check: ~1 under any backlog whatever the batch.",
                ["device"],
                registry=r,
            ),
            batch_size=Histogram(
                "fastllm_batch_size",
                "Sequences per engine step.",
                _MV,
                buckets=tuple(sorted(batch_buckets)),
                registry=r,
            ),
            batch_size_limit=Gauge(
                "fastllm_batch_size_limit",
                "Current batch-size limit set by the adaptive policy.",
                _MV,
                registry=r,
            ),
            num_requests_running=Gauge(
                "fastllm_num_requests_running",
                "Sequences in the running batch (each of a request's n choices counts).",
                _MV,
                registry=r,
            ),
            num_requests_waiting=Gauge(
                "fastllm_num_requests_waiting",
                "Sequences in the waiting queue (each of a request's n choices counts).",
                _MV,
                registry=r,
            ),
            time_to_first_token=Histogram(
                "fastllm_time_to_first_token_seconds",
                "Time from admission to the first generated token.",
                _MVE,
                buckets=lat,
                registry=r,
            ),
            time_per_output_token=Histogram(
                "fastllm_time_per_output_token_seconds",
                "Mean time per output token after the first.",
                _MVE,
                buckets=lat,
                registry=r,
            ),
            e2e_request_latency=Histogram(
                "fastllm_e2e_request_latency_seconds",
                "Time from admission to the end of the request.",
                _MVE,
                buckets=lat,
                registry=r,
            ),
            request_queue=Histogram(
                "fastllm_request_queue_seconds",
                "Time from admission to the first schedule.",
                _MVE,
                buckets=lat,
                registry=r,
            ),
            prompt_tokens=Counter(
                "fastllm_prompt_tokens_total", "Prompt tokens processed.", _MVE, registry=r
            ),
            generation_tokens=Counter(
                "fastllm_generation_tokens_total",
                "Tokens generated (every choice's).",
                _MVE,
                registry=r,
            ),
            request_success=Counter(
                "fastllm_request_success_total",
                "Requests that ended normally, by finished_reason.",
                [*_MVE, "finished_reason"],
                registry=r,
            ),
            request_failure=Counter(
                "fastllm_request_failure_total",
                "Requests that failed, by reason.",
                [*_MVE, "reason"],
                registry=r,
            ),
            allocator_bytes=Gauge(
                "fastllm_allocator_bytes",
                "Allocator bytes per tier and state (in_use, cached).",
                ["tier", "state"],
                registry=r,
            ),
            allocator_events=Counter(
                "fastllm_allocator_events_total",
                "Allocator events per tier (hit, miss, evict, release).",
                ["tier", "event"],
                registry=r,
            ),
            operator_anomalies=Counter(
                "fastllm_operator_anomalies_total",
                "Verified results whose error exceeds the threshold.",
                [*_MV, "op"],
                registry=r,
            ),
            scheduler_steals=Counter(
                "fastllm_scheduler_steals_total", "Work-stealing events.", registry=r
            ),
            inference_log_dropped=Counter(
                "fastllm_inference_log_dropped_total",
                "inference_log rows the writer could not store, by reason.",
                ["reason"],
                registry=r,
            ),
            inference_log_queue_rows=Gauge(
                "fastllm_inference_log_queue_rows",
                "inference_log rows queued in memory, not yet written.",
                registry=r,
            ),
            kv_cache_usage=Gauge(
                "fastllm_kv_cache_usage_ratio",
                "KV cache pages held by sequences / pages in the pool.",
                _MV,
                registry=r,
            ),
            kv_cache_pages=Gauge(
                "fastllm_kv_cache_pages",
                "KV cache pages by state (used, cached for prefix reuse, free).",
                [*_MV, "state"],
                registry=r,
            ),
            prefix_cache_queries=Counter(
                "fastllm_prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
                _MV,
                registry=r,
            ),
            prefix_cache_hits=Counter(
                "fastllm_prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache (their KV reused, not recomputed).",
                _MV,
                registry=r,
            ),
            num_preemptions=Counter(
                "fastllm_num_preemptions_total",
                "Sequences preempted for lack of KV pages (recomputed later).",
                _MV,
                registry=r,
            ),
            build_info=Gauge(
                "fastllm_build_info",
                "Build and configuration (value 1).",
                ["version", "model", "dtype", "device", "legacy"],
                registry=r,
            ),
            compile_fallbacks=Gauge(
                "fastllm_compile_fallbacks",
                "1 when the model's compiled decode step failed (at load or on a step) and the "
                "engine decodes on the eager forward instead; 0 while it runs compiled or when "
                "nothing is compiled (compile off).",
                ["model", "version"],
                registry=r,
            ),
        )

    def init_labels(self, model: str, version: str) -> None:
        """Create the zero-valued series of one served (model, version)."""
        for metric in (
            self.batch_size,
            self.batch_size_limit,
            self.num_requests_running,
            self.num_requests_waiting,
            self.kv_cache_usage,
            self.prefix_cache_queries,
            self.prefix_cache_hits,
            self.num_preemptions,
            self.compile_fallbacks,
        ):
            metric.labels(model, version)
        for state in KV_PAGE_STATES:
            self.kv_cache_pages.labels(model, version, state)
        for endpoint in ENDPOINTS:
            for metric in (
                self.time_to_first_token,
                self.time_per_output_token,
                self.e2e_request_latency,
                self.request_queue,
                self.prompt_tokens,
                self.generation_tokens,
            ):
                metric.labels(model, version, endpoint)
            for reason in FINISHED_REASONS:
                self.request_success.labels(model, version, endpoint, reason)
            for reason in FAILURE_REASONS:
                self.request_failure.labels(model, version, endpoint, reason)
        for op in VERIFIED_OPS:
            self.operator_anomalies.labels(model, version, op)

    def init_log_labels(self) -> None:
        for reason in LOG_DROP_REASONS:
            self.inference_log_dropped.labels(reason)

    def init_allocator_labels(self) -> None:
        for tier in ALLOCATOR_TIERS:
            for state in ALLOCATOR_STATES:
                self.allocator_bytes.labels(tier, state)
            for event in ALLOCATOR_EVENTS:
                self.allocator_events.labels(tier, event)

    def set_build_info(
        self, *, version: str, model: str, dtype: str, device: str, legacy: bool
    ) -> None:
        self.build_info.clear()
        self.build_info.labels(version, model, dtype, device, str(legacy).lower()).set(1)
