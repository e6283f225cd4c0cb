"""One app instance's telemetry, built from settings: a fresh registry with the contract metrics,
the memory collector, the Prometheus sink and the tracing sink. The server adds `sinks` to the
engine's `FanOut` and serves `render()` at /metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, make_asgi_app

from monitoring.device_activity import (
    TENSOR_ACTIVE_HELP,
    DeviceRatioCollector,
    GpmTensorActivity,
    nvml_busy_source,
)
from monitoring.metrics import FastllmMetrics
from monitoring.priority_metrics import PriorityMetrics, PrioritySink
from monitoring.prometheus_sink import PrometheusSink
from monitoring.samplers import MemoryCollector, gpu_memory_source
from monitoring.spec_metrics import SpecDecodeMetrics, SpecDecodeSink
from monitoring.structured_metrics import StructuredMetrics, StructuredOutputSink
from monitoring.tracer_provider import create_tracer_provider
from monitoring.tracing import TracingSink
from runtime.config import Settings
from runtime.engine.stats import AllocatorStats, StatsSink


def package_version() -> str:
    try:
        return metadata.version("fastllm-stack")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass
class Monitoring:
    registry: CollectorRegistry
    metrics: FastllmMetrics
    prometheus: PrometheusSink
    memory: MemoryCollector
    tracer_provider: TracerProvider
    tracing: TracingSink
    structured: StructuredOutputSink | None = None  # grammar metrics (structured output)
    priority: PrioritySink | None = None  # metrics per request priority
    spec: SpecDecodeSink | None = None  # speculative decoding's metrics

    content_type = CONTENT_TYPE_LATEST

    @property
    def sinks(self) -> list[StatsSink]:
        extra: list[StatsSink] = [
            s for s in (self.structured, self.priority, self.spec) if s is not None
        ]
        return [self.prometheus, self.tracing, *extra]

    def asgi_app(self) -> Any:
        """An ASGI app serving this registry (with content negotiation); mount it at /metrics."""
        return make_asgi_app(self.registry)

    def render(self) -> bytes:
        """The /metrics body (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        self.tracing.close()
        self.tracer_provider.shutdown()


def create_monitoring(
    settings: Settings,
    *,
    device: str = "cpu",
    models: list[tuple[str, str]] | None = None,
    allocator_stats: Callable[[], AllocatorStats | None] | None = None,
    utilization: Callable[[], float | None] | None = None,
    busy_fraction: Callable[[], float | None] | None = None,
    anomaly_threshold: float | None = None,
    tracer_provider: TracerProvider | None = None,
    is_legacy: bool = False,
) -> Monitoring:
    """`device` is the resolved device ("cpu", "cuda:0"). `utilization` is the engine's own u (the
    batch controller's input: fastllm_device_utilization_ratio, NaN without it). The busy ratio is
    NVML's duty cycle on CUDA, else `busy_fraction`, else the step stats; tensor activity is NVML
    GPM where the device has it, absent elsewhere. Memory: NVML on CUDA (torch.cuda fallback)."""
    registry = CollectorRegistry(auto_describe=True)
    metrics = FastllmMetrics.create(registry, latency_buckets_s=settings.latency_buckets_s)
    if models is None:
        models = [(settings.served_model_name, settings.model_version)]
        if settings.canary_model_path is not None:
            models.append((settings.served_model_name, settings.canary_version))
    threshold = anomaly_threshold if anomaly_threshold is not None else settings.verify_threshold
    sink_kwargs = {} if threshold is None else {"anomaly_threshold": threshold}
    prometheus = PrometheusSink(metrics, models=models, device=device, **sink_kwargs)
    if allocator_stats is not None:
        prometheus.set_allocator_source(allocator_stats)
    if utilization is not None:
        prometheus.set_utilization_source(utilization, device)
    busy = nvml_busy_source(device) or busy_fraction
    if busy is not None:
        prometheus.set_busy_source(busy, device)
    tensor_active = GpmTensorActivity.open(device)
    if tensor_active is not None:
        registry.register(
            DeviceRatioCollector(
                "fastllm_device_tensor_active_ratio",
                TENSOR_ACTIVE_HELP,
                device,
                tensor_active.read,
            )
        )
    memory = MemoryCollector(
        allocator_stats=allocator_stats,
        allocator_total_bytes=settings.kv_cache_bytes,
        gpu=gpu_memory_source(device),
    )
    registry.register(memory)
    metrics.set_build_info(
        version=package_version(),
        model=settings.served_model_name,
        dtype=settings.dtype,
        device=device,
        legacy=is_legacy or settings.legacy_support,
    )
    provider = tracer_provider or create_tracer_provider(
        service_name=settings.otel_service_name, sample_ratio=settings.trace_sample_ratio
    )
    return Monitoring(
        registry=registry,
        metrics=metrics,
        prometheus=prometheus,
        memory=memory,
        tracer_provider=provider,
        tracing=TracingSink(provider),
        structured=StructuredOutputSink(StructuredMetrics.create(registry), models),
        priority=PrioritySink(PriorityMetrics.create(registry, settings.latency_buckets_s), models),
        spec=SpecDecodeSink(
            SpecDecodeMetrics.create(registry), models, settings.speculative_method
        ),
    )
