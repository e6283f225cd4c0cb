"""NVML cross-checks exported beside the batch controller's input (never its input):

- `fastllm_device_busy_ratio{device}`: the duty cycle, NVML `utilization.gpu` ("percent of time
  over the past sample period during which one or more kernels was executing"); on CPU, or where
  NVML cannot say, the engine's busy fraction;
- `fastllm_device_tensor_active_ratio{device}`: on Hopper and newer, NVML GPM's
  `NVML_GPM_METRIC_ANY_TENSOR_UTIL` (share of time any SM ran tensor-core work) between two
  consecutive reads. Absent (no series) where the device or driver cannot give it.

A duty cycle reads ~1 under any backlog whatever the batch size, which is why it is not the
controller's input (docs/batching.md); next to `fastllm_device_utilization_ratio` it tells an
operator whether the device is idle (both low), busy on small batches (busy high, u low), or
saturated (both high). Tensor activity shows how much of that busy time is matmul work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from monitoring.samplers import _cuda_index, _nvml_handle

log = logging.getLogger(__name__)

Ratio = Callable[[], float | None]
MIN_GPM_INTERVAL_S = 0.1  # GPM needs samples this far apart; a faster scrape reuses the last value


def nvml_busy_source(device: str) -> Ratio | None:
    """NVML `utilization.gpu` (0-1) of a CUDA device; None on CPU or without NVML."""
    index = _cuda_index(device)
    handle = None if index is None else _nvml_handle(index)
    if handle is None:
        return None
    import pynvml

    def read() -> float | None:
        try:
            return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
        except Exception:  # driver hiccup, device lost: no reading, never an error
            return None

    return read


class GpmTensorActivity:
    """ANY_TENSOR_UTIL between the previous read's GPM sample and this one's."""

    def __init__(self, pynvml: Any, handle: Any, *, clock: Callable[[], float] = time.monotonic):
        self._nvml = pynvml
        self._handle = handle
        self._clock = clock
        self._lock = threading.Lock()
        self._previous = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, self._previous)
        self._previous_ts = clock()
        self._last: float | None = None

    @classmethod
    def open(cls, device: str) -> GpmTensorActivity | None:
        """None where GPM is unavailable: CPU, no NVML, a pre-Hopper GPU, an old driver."""
        index = _cuda_index(device)
        handle = None if index is None else _nvml_handle(index)
        if handle is None:
            return None
        try:
            import pynvml

            if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                return None
            return cls(pynvml, handle)
        except Exception:  # NVMLError_NotSupported, a missing symbol in an old driver, ...
            log.info("NVML GPM unavailable on %s", device, exc_info=True)
            return None

    def read(self) -> float | None:
        nvml = self._nvml
        with self._lock:
            now = self._clock()
            if now - self._previous_ts < MIN_GPM_INTERVAL_S:
                return self._last
            sample = nvml.nvmlGpmSampleAlloc()
            try:
                nvml.nvmlGpmSampleGet(self._handle, sample)
                request = nvml.c_nvmlGpmMetricsGet_t()
                request.version = nvml.NVML_GPM_METRICS_GET_VERSION
                request.numMetrics = 1
                request.sample1, request.sample2 = self._previous, sample
                request.metrics[0].metricId = nvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
                nvml.nvmlGpmMetricsGet(request)
                metric = request.metrics[0]
                ok = metric.nvmlReturn == nvml.NVML_SUCCESS
                value = min(1.0, max(0.0, float(metric.value) / 100.0)) if ok else None
            except Exception:
                nvml.nvmlGpmSampleFree(sample)
                return None
            nvml.nvmlGpmSampleFree(self._previous)
            self._previous, self._previous_ts, self._last = sample, now, value
            return value


class DeviceRatioCollector(Collector):
    """One gauge family with a `device` label whose sample exists only while `read` has a value."""

    def __init__(self, name: str, documentation: str, device: str, read: Ratio) -> None:
        self.name, self.documentation = name, documentation
        self.device, self.read = device, read

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.name, self.documentation, labels=["device"])]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=["device"])
        try:
            value = self.read()
        except Exception:  # a reader must never break the scrape
            log.exception("%s unavailable", self.name)
            value = None
        if value is not None:
            family.add_metric([self.device], value)
        return [family]


TENSOR_ACTIVE_HELP = "Share of time tensor cores were active (NVML GPM; Hopper and newer)."
