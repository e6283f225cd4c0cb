"""Scrape-time samplers: memory per type (device activity: monitoring.device_activity).

`MemoryCollector` is a prometheus_client custom collector: its `collect()` reads the numbers when
Prometheus scrapes, so values are exact and nothing polls in the background. Both gauges carry only
the `type` label, so the operations guide's `fastllm_memory_usage{type="gpu"} /
fastllm_memory_total` pairs series one to one. The `gpu` type exists only on CUDA; on CPU it is
absent, never faked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psutil
from prometheus_client.metrics_core import GaugeMetricFamily, Metric, UnknownMetricFamily
from prometheus_client.registry import Collector

from runtime.engine.stats import AllocatorStats

log = logging.getLogger(__name__)

MemoryReading = Callable[[], tuple[int, int] | None]  # () -> (bytes used, bytes total)


class MemoryCollector(Collector):
    def __init__(
        self,
        *,
        allocator_stats: Callable[[], AllocatorStats | None] | None = None,
        allocator_total_bytes: int | None = None,
        gpu: MemoryReading | None = None,
    ) -> None:
        self.allocator_stats = allocator_stats
        self.allocator_total_bytes = allocator_total_bytes
        self.gpu = gpu
        self._process = psutil.Process()

    def describe(self) -> Iterable[Metric]:
        # Names only: registration must not sample (and must not touch CUDA).
        return self._families({})

    def collect(self) -> Iterable[Metric]:
        return self._families(dict(self._readings()))

    def _readings(self) -> Iterator[tuple[str, tuple[int, int]]]:
        yield "cpu", (self._process.memory_info().rss, psutil.virtual_memory().total)
        if self.allocator_stats is not None:
            try:
                stats = self.allocator_stats()
            except Exception:
                log.exception("allocator stats unavailable")
                stats = None
            if stats is not None:
                total = self.allocator_total_bytes
                yield "allocator", (stats.bytes_in_use, total if total is not None else 0)
        if self.gpu is not None:
            try:
                reading = self.gpu()
            except Exception:
                log.exception("gpu memory unavailable")
                reading = None
            if reading is not None:
                yield "gpu", reading

    @staticmethod
    def _families(readings: dict[str, tuple[int, int]]) -> list[Metric]:
        usage = GaugeMetricFamily(
            "fastllm_memory_usage",
            "Bytes in use by type (gpu, cpu RSS, allocator).",
            labels=["type"],
        )
        # Semantically a gauge, but exposed untyped: the name is fixed by the operations guide and
        # promtool's lint rejects a *gauge* ending in `_total` (untyped is exempt). Queries are
        # unaffected.
        total = UnknownMetricFamily(
            "fastllm_memory_total", "Bytes available to that type.", labels=["type"]
        )
        for kind, (used, available) in readings.items():
            usage.add_metric([kind], float(used))
            total.add_metric([kind], float(available))
        return [usage, total]


# --- CUDA sources (only built when the device is CUDA) -------------------------------------------


def _cuda_index(device: str) -> int | None:
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index else 0


def _nvml_handle(index: int) -> Any | None:
    """NVML handle of the CUDA device `index`, matched by UUID (CUDA_VISIBLE_DEVICES renumbers)."""
    try:
        import pynvml
        import torch

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:
        log.info("NVML unavailable for cuda:%d", index, exc_info=True)
        return None


def gpu_memory_source(device: str) -> MemoryReading | None:
    """(used, total) device memory of a CUDA device: NVML when present, else
    torch.cuda.mem_get_info; None on CPU so the `gpu` type is simply absent."""
    index = _cuda_index(device)
    if index is None:
        return None
    handle = _nvml_handle(index)
    if handle is not None:
        import pynvml

        def read_nvml() -> tuple[int, int]:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.used), int(info.total)

        return read_nvml

    import torch

    def read_torch() -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(index)
        return total - free, total

    return read_torch
