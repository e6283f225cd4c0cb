"""LoRA adapter metrics (runtime.engine.lora), on the app's registry:

    fastllm_lora_adapters{model,version,state}             gauge    resident: weights in a block;
                                                                    loading: being read right now
    fastllm_lora_adapter_bytes{model,version,adapter}      gauge    each resident adapter's block
    fastllm_lora_loads_total{model,version}                counter  adapters made resident
    fastllm_lora_evictions_total{model,version}            counter  LRU evictions (max_loras)
    fastllm_lora_requests_total{model,version,adapter}     counter  finished requests per adapter

`fastllm_lora_adapters{state}` and `fastllm_lora_requests_total{adapter}` are DESIGN.md's names.
The first four are read from the engines' registries at scrape time (a collector, like the
self-check's): a loaded causal LM shows them at 0 before any adapter. The requests counter is a
sink over finished requests' `adapter` field (a series per adapter once it served a request). An
engine that is not loaded yet, or can serve no adapters (tensor-parallel), shows no sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.engine.stats import RequestStats, StepStats, VerificationResult

__all__ = ["ADAPTER_STATES", "LORA_METRIC_NAMES", "LoraCollector", "LoraRequestSink"]

LORA_METRIC_NAMES: tuple[str, ...] = (
    "fastllm_lora_adapters",
    "fastllm_lora_adapter_bytes",
    "fastllm_lora_loads_total",
    "fastllm_lora_evictions_total",
    "fastllm_lora_requests_total",
)
_MV = ["model", "version"]
ADAPTER_STATES: tuple[str, ...] = ("resident", "loading")
# (model, version, the engine's lora_stats: a runtime.engine.lora.LoraStats or None)
Source = tuple[str, str, Callable[[], Any]]


class LoraCollector(Collector):
    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The families without samples: registration reads these, never the engines."""
        return self._families()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return self._families(self.sources)

    def _families(
        self, sources: Sequence[Source] = ()
    ) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        adapters = GaugeMetricFamily(
            "fastllm_lora_adapters",
            "LoRA adapters by state: resident (weights in an allocator block, at most "
            "max_loras) or loading (being read from their directory).",
            labels=[*_MV, "state"],
        )
        nbytes = GaugeMetricFamily(
            "fastllm_lora_adapter_bytes",
            "Allocator bytes of each resident LoRA adapter.",
            labels=[*_MV, "adapter"],
        )
        loads = CounterMetricFamily(
            "fastllm_lora_loads",
            "LoRA adapters made resident (loads and reloads after an eviction).",
            labels=_MV,
        )
        evictions = CounterMetricFamily(
            "fastllm_lora_evictions",
            "Resident LoRA adapters evicted (least recently used, beyond max_loras).",
            labels=_MV,
        )
        for model, version, stats_of in sources:
            stats = stats_of()
            if stats is None:
                continue
            adapters.add_metric([model, version, "resident"], stats.num_resident)
            adapters.add_metric([model, version, "loading"], stats.num_loading)
            for adapter, size in sorted(stats.resident_bytes.items()):
                nbytes.add_metric([model, version, adapter], size)
            loads.add_metric([model, version], stats.loads_total)
            evictions.add_metric([model, version], stats.evictions_total)
        yield from (adapters, nbytes, loads, evictions)


class LoraRequestSink:
    """A StatsSink: counts finished requests by the adapter they ran with."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "fastllm_lora_requests_total",
            "Finished requests served with a LoRA adapter, by adapter.",
            [*_MV, "adapter"],
            registry=registry,
        )

    def record(
        self,
        step: StepStats | None = None,
        finished: Sequence[RequestStats] = (),
        verified: Sequence[VerificationResult] = (),
    ) -> None:
        for r in finished:
            if r.adapter:
                self.requests.labels(r.model, r.version, r.adapter).inc()


def _loaded_only(engine: Any) -> Callable[[], Any]:
    """The engine's LoRA stats once it is loaded; None before (reading them earlier would load
    the model, at a scrape or at registration, on the caller's thread)."""
    return lambda: engine.lora_stats() if engine.is_loaded else None


def attach(registry: CollectorRegistry, engines: Sequence[tuple[str, str, Any]]) -> LoraRequestSink:
    """The collector over the engines (those with `lora_stats`) and the requests sink."""
    sources = [(m, v, _loaded_only(e)) for m, v, e in engines if hasattr(e, "lora_stats")]
    registry.register(LoraCollector(sources))
    return LoraRequestSink(registry)
