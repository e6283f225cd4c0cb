"""The NVML cross-checks: the duty-cycle reader and the GPM tensor-activity reader through a
stand-in pynvml module (the real ones on a GPU machine, `-m cuda`), and their series absent
wherever they cannot be read."""

from __future__ import annotations

import sys
import types

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import monitoring.device_activity as activity
from monitoring.device_activity import DeviceRatioCollector, GpmTensorActivity, nvml_busy_source


class FakeNvml(types.ModuleType):
    """The slice of pynvml the readers use. Tensor activity advances by `tensor_pct` per sample."""

    NVML_SUCCESS = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5

    def __init__(self, *, gpm_supported: bool = True) -> None:
        super().__init__("pynvml")
        self.gpm_supported = gpm_supported
        self.gpu_pct: int | None = 73
        self.tensor_pct = 40.0
        self.fail_metrics = False
        self.allocated = 0
        self.freed = 0

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> object:
        if self.gpu_pct is None:
            raise RuntimeError("GPU is lost")
        return types.SimpleNamespace(gpu=self.gpu_pct, memory=0)

    def nvmlGpmQueryDeviceSupport(self, handle: object) -> object:
        return types.SimpleNamespace(isSupportedDevice=int(self.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> dict:
        self.allocated += 1
        return {}

    def nvmlGpmSampleFree(self, sample: dict) -> None:
        self.freed += 1

    def nvmlGpmSampleGet(self, handle: object, sample: dict) -> dict:
        sample["tensor"] = self.tensor_pct
        return sample

    def c_nvmlGpmMetricsGet_t(self) -> object:
        metric = types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0)
        return types.SimpleNamespace(metrics=[metric], sample1=None, sample2=None)

    def nvmlGpmMetricsGet(self, request: types.SimpleNamespace) -> object:
        if self.fail_metrics:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        metric = request.metrics[0]
        assert metric.metricId == self.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        assert request.version == self.NVML_GPM_METRICS_GET_VERSION and request.numMetrics == 1
        metric.value = request.sample2["tensor"]
        return request


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(activity, "_nvml_handle", lambda index: ("handle", index))
    return fake


def test_busy_reader_reads_the_duty_cycle_and_none_on_error(nvml: FakeNvml) -> None:
    read = nvml_busy_source("cuda:0")
    assert read is not None and read() == pytest.approx(0.73)
    nvml.gpu_pct = None
    assert read() is None  # a lost device is no reading, never an exception
    assert nvml_busy_source("cpu") is None


def test_gpm_reads_tensor_activity_between_samples(nvml: FakeNvml) -> None:
    clock = [0.0]
    reader = GpmTensorActivity(nvml, ("handle", 0), clock=lambda: clock[0])
    clock[0] = 1.0
    assert reader.read() == pytest.approx(0.40)
    nvml.tensor_pct = 90.0
    clock[0] = 1.05  # faster than GPM can sample: the last value again, no new sample
    assert reader.read() == pytest.approx(0.40) and nvml.allocated == 2
    clock[0] = 2.0
    assert reader.read() == pytest.approx(0.90)
    assert nvml.allocated - nvml.freed == 1  # only the previous sample stays alive
    nvml.fail_metrics = True
    clock[0] = 3.0
    assert reader.read() is None and nvml.allocated - nvml.freed == 1


def test_gpm_absent_where_unsupported(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    assert GpmTensorActivity.open("cpu") is None
    assert GpmTensorActivity.open("cuda:0") is not None
    nvml.gpm_supported = False  # e.g. an A100: GPM is Hopper and newer
    assert GpmTensorActivity.open("cuda:0") is None
    monkeypatch.setattr(activity, "_nvml_handle", lambda index: None)  # no driver
    assert GpmTensorActivity.open("cuda:0") is None


def test_collector_has_a_sample_only_while_the_reader_has_a_value() -> None:
    value: list[float | None] = [0.25]

    def read() -> float | None:
        if value[0] is None:
            raise RuntimeError("reader broke")
        return value[0]

    registry = CollectorRegistry()
    registry.register(DeviceRatioCollector("fastllm_x_ratio", "x", "cuda:0", read))
    assert registry.get_sample_value("fastllm_x_ratio", {"device": "cuda:0"}) == 0.25
    value[0] = None  # raises inside the scrape: the series is absent, the scrape still works
    assert registry.get_sample_value("fastllm_x_ratio", {"device": "cuda:0"}) is None
    assert b"# TYPE fastllm_x_ratio gauge" in generate_latest(registry)


def _busy_matmuls(seconds: float) -> None:
    import time

    import torch

    a = torch.randn(4096, 4096, device="cuda")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()


@pytest.mark.cuda
def test_real_nvml_busy_ratio_sees_a_busy_gpu() -> None:
    read = nvml_busy_source("cuda:0")
    assert read is not None, "NVML should be available next to a CUDA device"
    _busy_matmuls(2.0)
    ratio = read()
    assert ratio is not None and 0.5 < ratio <= 1.0


@pytest.mark.cuda
def test_real_gpm_tensor_activity_on_hopper_and_absent_before() -> None:
    import torch

    reader = GpmTensorActivity.open("cuda:0")
    major, _ = torch.cuda.get_device_capability(0)
    if major < 9:
        assert reader is None  # pre-Hopper: absent, never an error
        return
    assert reader is not None
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls use tensor cores only as TF32
    try:
        reader.read()
        _busy_matmuls(2.0)
        ratio = reader.read()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert ratio is not None and 0.0 < ratio <= 1.0
