"""Utilization sources: the busy-fraction tracker on a virtual clock, NVML through a stand-in
module (and for real on a GPU machine, `-m cuda`)."""

from __future__ import annotations

import sys
import types

import pytest

from runtime.engine.batching.controller import (
    AdaptiveBatchController,
    BatchPolicyConfig,
    BusyFractionSource,
    BusyTracker,
    NvmlUtilization,
)
from runtime.engine.batching.utilization import _nvml_index, make_utilization_source
from runtime.errors import ConfigError


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_busy_tracker_fraction_over_window() -> None:
    clock = Clock(100.0)
    tracker = BusyTracker(window_s=2.0, clock=clock)
    clock.t = 101.0
    tracker.add_busy(0.25)  # [100.75, 101.0]
    assert tracker.fraction() == pytest.approx(0.25)  # young tracker: window = its 1 s age
    clock.t = 102.0
    tracker.add_busy(0.5)  # [101.5, 102.0]
    assert tracker.fraction() == pytest.approx(0.75 / 2.0)
    # at 103.0 the window is [101.0, 103.0]: the first interval has left it
    assert tracker.fraction(103.0) == pytest.approx(0.5 / 2.0)
    # at 103.75 the window [101.75, 103.75] cuts the second interval in half
    assert tracker.fraction(103.75) == pytest.approx(0.25 / 2.0)
    assert tracker.fraction(110.0) == 0.0


def test_busy_tracker_edge_cases() -> None:
    clock = Clock(5.0)
    tracker = BusyTracker(window_s=1.0, clock=clock)
    assert tracker.fraction() is None  # no time has passed
    tracker.add_busy(0.0)
    tracker.add_busy(-1.0)
    clock.t = 7.0
    tracker.add_busy(3.0)  # longer than the window: saturates, never above 1
    assert tracker.fraction() == 1.0
    with pytest.raises(ConfigError):
        BusyTracker(window_s=0.0)


def test_busy_fraction_source_feeds_the_controller() -> None:
    clock = Clock(0.0)
    tracker = BusyTracker(window_s=1.0, clock=clock)
    ctl = AdaptiveBatchController(
        BatchPolicyConfig(initial=10), BusyFractionSource.from_tracker(tracker), clock=clock
    )
    ctl.maybe_update()
    clock.t = 1.0
    tracker.add_busy(0.9)
    assert ctl.maybe_update() == 9  # 90% busy > 0.8: shrink
    clock.t = 2.0
    tracker.add_busy(0.2)
    assert ctl.maybe_update() == 11  # 20% busy < 0.6: grow (10 * 0.9 -> 9 -> 9 * 1.2 = 10.8)


def fake_pynvml(monkeypatch: pytest.MonkeyPatch, *, init_error: bool = False) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    calls: dict[str, object] = {"shutdown": 0, "gpu": 73}

    class NVMLError(Exception):
        pass

    def init() -> None:
        if init_error:
            raise NVMLError("NVML Shared Library Not Found")

    def rates(handle: object) -> object:
        if calls["gpu"] is None:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(gpu=calls["gpu"], memory=0)

    def shutdown() -> None:
        calls["shutdown"] = int(calls["shutdown"]) + 1  # type: ignore[call-overload]

    def by_index(i: int) -> object:
        if i > 1:
            raise NVMLError("Invalid Argument")
        return ("handle", i)

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.nvmlInit = init  # type: ignore[attr-defined]
    mod.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = by_index  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByUUID = lambda u: ("uuid", u)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetUtilizationRates = rates  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def test_nvml_reads_gpu_ratio_and_none_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    mod = fake_pynvml(monkeypatch)
    src = NvmlUtilization("cuda:1")
    assert src.read() == pytest.approx(0.73)
    mod.calls["gpu"] = None  # type: ignore[attr-defined]
    assert src.read() is None
    src.close()
    src.close()
    assert mod.calls["shutdown"] == 1  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="no device"):
        NvmlUtilization(5)


def test_nvml_unavailable_is_a_clear_error_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pynvml(monkeypatch, init_error=True)
    with pytest.raises(ConfigError, match="NVML is unavailable"):
        NvmlUtilization(0)
    src = make_utilization_source("cuda:0", lambda: 0.4)
    assert isinstance(src, BusyFractionSource) and src.read() == 0.4
    assert isinstance(make_utilization_source("cpu", lambda: None), BusyFractionSource)


def test_nvml_index_follows_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert _nvml_index("cuda:1") == 1 and _nvml_index("cuda") == 3 and _nvml_index(0) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert _nvml_index("cuda:0") == "GPU-abc"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _nvml_index("cuda:2") == 2


@pytest.mark.cuda
def test_real_nvml_sees_a_busy_gpu() -> None:
    import torch

    src = NvmlUtilization("cuda:0")
    try:
        a = torch.randn(4096, 4096, device="cuda")
        readings = []
        for _ in range(40):  # ~ a few seconds of back-to-back matmuls
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
            readings.append(src.read())
        assert all(r is not None and 0.0 <= r <= 1.0 for r in readings)
        assert max(r for r in readings if r is not None) > 0.5
    finally:
        src.close()


@pytest.mark.cuda
@pytest.mark.slow
def test_nvml_closed_loop_settles_in_band() -> None:
    """A step runs `limit` units of GPU work then idles a fixed 20 ms, so utilization rises with the
    batch limit (about L / (L + 8) once a unit is calibrated to 2.5 ms). NVML feeds the controller
    with the band set to 70-80%; the limit must settle where NVML reads inside the band."""
    import statistics
    import time

    import torch

    a = torch.randn(1024, 1024, device="cuda")

    def unit(n: int) -> None:
        nonlocal a
        for _ in range(n):
            a = (a @ a).clamp_(-1, 1)

    unit(10)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    unit(200)
    torch.cuda.synchronize()
    per_matmul = (time.perf_counter() - t0) / 200
    matmuls_per_unit = max(1, round(0.0025 / per_matmul))

    src = NvmlUtilization("cuda:0")
    try:
        ctl = AdaptiveBatchController(BatchPolicyConfig(initial=8, interval_s=1.0), src)
        ctl.set_batch_policy(0.7, 0.8, 0.1)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            unit(ctl.limit * matmuls_per_unit)
            torch.cuda.synchronize()
            time.sleep(0.02)
            ctl.maybe_update()
        tail = [d.utilization for d in ctl.stats().recent[-10:] if d.utilization is not None]
        assert len(tail) >= 8
        assert 0.7 <= statistics.median(tail) <= 0.8, ctl.stats().recent
    finally:
        src.close()


def test_busy_tracker_stays_bounded_when_nobody_reads_it() -> None:
    # with NVML as the controller's source nobody calls fraction(): add_busy must prune itself
    now = [0.0]
    tracker = BusyTracker(window_s=1.0, clock=lambda: now[0])
    for _ in range(10_000):
        now[0] += 0.01
        tracker.add_busy(0.005)
    assert len(tracker._intervals) <= 101
    assert tracker.fraction() == pytest.approx(0.5, abs=0.01)
